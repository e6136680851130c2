"""Labelled rows for a classifier (objectives/classify.py): the input text, its truncation, and the loader.

A row ``{"prompt", "response", "label"}`` (rows.py, kind ``labelled``) becomes plain text, whatever the tokenizer
(no chat template): ``"User: <prompt>\\n"`` then, when there is a response, ``"Assistant: <response>"``, each
encoded without special tokens, between the bos (where the tokenizer has one) and the eos. The class is read at
the eos, the last real token. A long input keeps, within ``max_tokens``, the *end* of the prompt (at least
``prompt_tokens`` of it, more when the response leaves room) and the *start and end* of the response (refusals
open a response, referrals close it).

An encoder classifier reads pairs instead (:class:`PairLoader`). Batches: ``input_ids`` (B, T) right-padded to the batch's longest input (causal attention: the pads after a
row's eos are never seen, so the width does not change any class logit), ``lengths`` (B,) and ``class_ids`` (B,).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import torch

from meshlm.data.posttrain.encode import EncodeStats
from meshlm.data.posttrain.loaders import _fingerprint, _Order, _OrderedLoader
from meshlm.data.posttrain.rows import Row
from meshlm.data.posttrain.templates import Encoded
from meshlm.errors import DataError
from meshlm.tokenizer import MeshTokenizer


def classifier_text(prompt: str, response: str | None) -> tuple[str, str]:
    """(prompt part, response part) of a classifier's input; the response part is empty for a prompt alone."""
    return f"User: {prompt}\n", ("" if response is None else f"Assistant: {response}")


def classifier_ids(tokenizer: MeshTokenizer, prompt: str, response: str | None, max_tokens: int,
                   prompt_tokens: int) -> list[int]:
    """The token ids of one input, truncated to ``max_tokens`` as the module docstring says."""
    head = [tokenizer.bos_id] if tokenizer.bos_id is not None else []
    p_text, r_text = classifier_text(prompt, response)
    budget = max_tokens - len(head) - 1  # the eos closes every input
    p_ids = tokenizer.encode(p_text)
    r_ids = tokenizer.encode(r_text) if r_text else []
    p_keep = min(len(p_ids), max(prompt_tokens, budget - len(r_ids)))
    p_ids = p_ids[len(p_ids) - p_keep:]
    room = budget - len(p_ids)
    if len(r_ids) > room:  # keep the response's start and end
        r_ids = r_ids[:room - room // 2] + r_ids[len(r_ids) - room // 2:]
    return head + p_ids + r_ids + [tokenizer.eos_id]


def encode_labelled(rows: Sequence[Row], tokenizer: MeshTokenizer, classes: Sequence[str], max_tokens: int,
                    prompt_tokens: int) -> tuple[list[tuple[list[int], int]], EncodeStats]:
    """(ids, class index) per row; a label outside ``classes`` raises, naming the row."""
    if prompt_tokens + 2 > max_tokens:
        raise DataError(f"objective.prompt_tokens ({prompt_tokens}) leaves no room for a response in data.seq_len "
                        f"({max_tokens}) tokens; lower it")
    for row in rows:  # every label before any tokenizing
        if row.label not in classes:
            raise DataError(f"{row.where}: label {row.label!r} is not one of the classes {', '.join(classes)} "
                            "(objective.classes)")
    stats = EncodeStats(rows=len(rows))
    out = []
    for row in rows:
        ids = classifier_ids(tokenizer, row.prompt, row.completion, max_tokens, prompt_tokens)
        out.append((ids, list(classes).index(row.label)))
        stats.examples += 1
        stats.tokens += len(ids)
        stats.loss_tokens += 1  # one class per row
    return out, stats


class LabelledLoader(_OrderedLoader):
    """Batches of classified inputs (module docstring for the layout); the order of loaders.py."""

    def __init__(self, examples: Sequence[tuple[list[int], int]], seq_len: int, global_batch_size: int, *,
                 pad_id: int, dp_rank: int = 0, dp_size: int = 1, seed: int = 0, shuffle: bool = True) -> None:
        self.examples, self.pad_id = list(examples), pad_id
        longest = max((len(ids) for ids, _ in self.examples), default=0)
        if longest > seq_len:
            raise DataError(f"an input has {longest} tokens, more than seq_len {seq_len}; encode with "
                            "encode_labelled first")
        tag = "labelled" + ",".join(str(c) for _, c in self.examples)
        fingerprint = _fingerprint([Encoded(ids, [False] * len(ids)) for ids, _ in self.examples], tag)
        self._order = _Order("labelled", len(self.examples), fingerprint, seq_len, global_batch_size, dp_rank,
                             dp_size, seed, shuffle)

    def next_batch(self) -> dict[str, torch.Tensor]:
        picked = [self.examples[i] for i in self._order.next_items()]
        width = max(len(ids) for ids, _ in picked)
        input_ids = torch.full((len(picked), width), self.pad_id, dtype=torch.long)  # (B, T)
        for row, (ids, _) in enumerate(picked):
            input_ids[row, :len(ids)] = torch.tensor(ids)
        return {"input_ids": input_ids,
                "lengths": torch.tensor([len(ids) for ids, _ in picked], dtype=torch.long),  # (B,)
                "class_ids": torch.tensor([c for _, c in picked], dtype=torch.long)}  # (B,)


class PairLoader(_OrderedLoader):
    """Batches of labelled (prompt, response) pairs for an encoder classifier (the encoder judge,
    safety/encoder_judge.py), tokenized per batch by the encoder's own tokenizer — ``[CLS] prompt [SEP] response
    [SEP]``, the longer side truncated first to ``max_len`` tokens — and right-padded to the batch's longest:
    ``input_ids``, ``mask`` (1 on real tokens), ``type_ids`` (0 prompt, 1 response), each (B, T), and
    ``class_ids`` (B,). ``tokenizer``: anything with ``batch(firsts, seconds, max_len)`` returning ``ids``,
    ``mask`` and ``type_ids`` (meshlm/models/encoder.py's EncoderTokenizer)."""

    def __init__(self, pairs: Sequence[tuple[str, str, int]], tokenizer, max_len: int, global_batch_size: int, *,
                 dp_rank: int = 0, dp_size: int = 1, seed: int = 0, shuffle: bool = True) -> None:
        self.pairs, self.tokenizer, self.max_len = list(pairs), tokenizer, max_len
        digest = hashlib.sha256(b"pairs")
        for prompt, response, cls in self.pairs:
            digest.update(json.dumps([prompt, response, cls]).encode())
        self._order = _Order("pairs", len(self.pairs), digest.hexdigest(), max_len, global_batch_size, dp_rank,
                             dp_size, seed, shuffle)

    def next_batch(self) -> dict[str, torch.Tensor]:
        picked = [self.pairs[i] for i in self._order.next_items()]
        enc = self.tokenizer.batch([p for p, _, _ in picked], [r for _, r, _ in picked], self.max_len)
        return {"input_ids": enc["ids"], "mask": enc["mask"], "type_ids": enc["type_ids"],
                "class_ids": torch.tensor([c for _, _, c in picked], dtype=torch.long)}
