"""Deterministic, rank-aware, resumable loaders over encoded post-training data.

They follow :class:`meshlm.data.loader.SequenceLoader`: item i of the run's global sample stream g is
``perm_e[g % n]`` with ``e = g // n`` and ``perm_e`` a NumPy PCG64 permutation seeded by (seed, e) (identity
without shuffling); global batch b is samples ``[b*G, (b+1)*G)`` and dp rank r of d takes the slice
``[r*G/d, (r+1)*G/d)``. The state counts global samples only, so a resumed run may change its dp size.

- :class:`SFTLoader`: an item is one sequence of ``seq_len`` positions (several rows when packed, one when
  not; see packing.py). Batches: ``input_ids``, ``labels``, ``position_ids``, ``document_ids``, all (B, T).
- :class:`PreferenceLoader`: an item is one chosen/rejected pair. Batches have 2B rows, the B chosen sequences
  first and then their B rejected ones, right-padded to the batch's longest sequence (T = that length, rounded up
  to ``pad_multiple``; at most ``seq_len``), not to ``seq_len``: pairs are often far shorter than ``seq_len``, and
  the padding would be computed forward and backward, by the policy and its reference. Every quantity a pair
  objective reads is a sum over a row's real tokens, so the width changes no loss. ``input_ids``, ``labels``,
  ``attention_mask`` (bool), ``position_ids``, ``document_ids`` (0 real, 1 padding), all (2B, T), and
  ``prompt_lengths`` and ``lengths`` (2B,): the response starts at ``prompt_lengths`` and the last real token
  is at ``lengths - 1`` (where a reward model reads its score); ``index`` (2B,) is each row's pair number.
- :class:`PromptLoader`: an item is one prompt (PPO/GRPO rollouts). Batches are ragged: ``prompt_ids`` (a list
  of token-id lists), ``extra`` (each row's other fields, for a reward function) and ``index`` (row numbers).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch

from meshlm.data.posttrain.encode import PreferencePair
from meshlm.data.posttrain.packing import SEQUENCE_KEYS, build_sequence, plan_packing, plan_padded, row_labels
from meshlm.data.posttrain.templates import Encoded
from meshlm.errors import DataError
from meshlm.models.head import IGNORE_INDEX

STATE_VERSION = 1


class _Order:
    """The sample order and the resumable state shared by the loaders."""

    def __init__(self, kind: str, num_items: int, fingerprint: str, seq_len: int, global_batch_size: int,
                 dp_rank: int, dp_size: int, seed: int, shuffle: bool) -> None:
        for name, value in (("seq_len", seq_len), ("global_batch_size", global_batch_size), ("dp_size", dp_size)):
            if not isinstance(value, int) or value < 1:
                raise DataError(f"{name} {value!r} is invalid; use a positive integer")
        if global_batch_size % dp_size:
            raise DataError(f"global batch size {global_batch_size} is not divisible by the data-parallel size "
                            f"{dp_size}; choose a global batch size that is a multiple of it")
        if not 0 <= dp_rank < dp_size:
            raise DataError(f"dp_rank {dp_rank} is outside [0, {dp_size})")
        if not isinstance(seed, int) or seed < 0:
            raise DataError(f"seed {seed!r} is invalid; use a non-negative integer")
        if num_items < 1:
            raise DataError(f"no {kind} items to train on: every row was dropped (see the encode stats); check "
                            "data.path and data.seq_len")
        self.kind, self.num_items, self.fingerprint, self.seq_len = kind, num_items, fingerprint, seq_len
        self.global_batch_size, self.dp_rank, self.dp_size = global_batch_size, dp_rank, dp_size
        self.seed, self.shuffle = seed, shuffle
        self.local_batch_size = global_batch_size // dp_size
        self.samples_consumed = 0
        self._permutations: dict[int, np.ndarray] = {}

    def next_items(self) -> list[int]:
        """This rank's item indices of the next global batch; advances the state."""
        first = self.samples_consumed + self.dp_rank * self.local_batch_size
        items = [self._item(g) for g in range(first, first + self.local_batch_size)]
        self.samples_consumed += self.global_batch_size
        return items

    def _item(self, sample: int) -> int:
        epoch, position = divmod(sample, self.num_items)
        if not self.shuffle:
            return position
        if epoch not in self._permutations:
            if len(self._permutations) >= 2:  # keep memory flat: a batch touches few epochs
                self._permutations.pop(min(self._permutations))
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
            self._permutations[epoch] = rng.permutation(self.num_items)
        return int(self._permutations[epoch][position])

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "kind": self.kind, "order": "shuffled" if self.shuffle else "sequential",
                "seed": self.seed, "seq_len": self.seq_len, "global_batch_size": self.global_batch_size,
                "samples_consumed": self.samples_consumed, "num_items": self.num_items,
                "data_fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        expected = self.state_dict()
        missing = [k for k in expected if k not in state]
        if missing:
            raise DataError(f"loader state lacks {missing}; it was not written by a {self.kind} loader")
        for key, hint in (("kind", "resume with the same objective"), ("seq_len", "resume with the same seq_len"),
                          ("global_batch_size", "resume with the same global batch size (dp size may change)"),
                          ("order", "resume with the same shuffle setting"),
                          ("num_items", "the data, tokenizer or packing changed since the checkpoint"),
                          ("data_fingerprint", "the data, tokenizer or packing changed since the checkpoint")):
            if state[key] != expected[key]:
                raise DataError(f"loader state has {key}={state[key]!r} but this loader has {expected[key]!r}; {hint}")
        consumed = state["samples_consumed"]
        if not isinstance(consumed, int) or consumed < 0 or consumed % self.global_batch_size:
            raise DataError(f"loader state has invalid samples_consumed={consumed!r}")
        self.seed, self.samples_consumed = int(state["seed"]), consumed
        self._permutations.clear()


class _OrderedLoader:
    """What every post-training loader shares: the sample order (``_order``, an :class:`_Order`), iteration,
    reset and the JSON state. Subclasses set ``_order`` and define ``next_batch``."""

    _order: _Order

    @property
    def samples_consumed(self) -> int:
        return self._order.samples_consumed

    def next_batch(self):
        raise NotImplementedError

    def reset(self) -> None:
        self._order.samples_consumed = 0

    def __iter__(self):
        return self

    def __next__(self):
        return self.next_batch()

    def state_dict(self) -> dict:
        return self._order.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self._order.load_state_dict(state)


class SFTLoader(_OrderedLoader):
    """Batches of packed (or padded, one row each) sequences of ``seq_len`` positions."""

    def __init__(self, examples: Sequence[Encoded], seq_len: int, global_batch_size: int, *, pad_id: int,
                 packing: bool = True, dp_rank: int = 0, dp_size: int = 1, seed: int = 0,
                 shuffle: bool = True) -> None:
        self.examples, self.seq_len, self.pad_id, self.packing = list(examples), seq_len, pad_id, packing
        lengths = [len(e.ids) for e in self.examples]
        self.bins = plan_packing(lengths, seq_len) if packing else plan_padded(len(lengths))
        if not packing and lengths and max(lengths) > seq_len:
            raise DataError(f"a row has {max(lengths)} tokens, more than seq_len {seq_len}; truncate rows first")
        fingerprint = _fingerprint(self.examples, f"sft packing={packing}")
        self._order = _Order("sft", len(self.bins), fingerprint, seq_len, global_batch_size, dp_rank, dp_size,
                             seed, shuffle)

    @property
    def num_sequences(self) -> int:
        return len(self.bins)

    def next_batch(self) -> dict[str, torch.Tensor]:
        items = self._order.next_items()
        seqs = [build_sequence(self.examples, self.bins[i], self.seq_len, self.pad_id) for i in items]
        return {k: torch.from_numpy(np.stack([s[k] for s in seqs])) for k in SEQUENCE_KEYS}  # (B, T) each


class PreferenceLoader(_OrderedLoader):
    """Batches of chosen/rejected pairs (module docstring for the layout)."""

    def __init__(self, pairs: Sequence[PreferencePair], seq_len: int, global_batch_size: int, *, pad_id: int,
                 dp_rank: int = 0, dp_size: int = 1, seed: int = 0, shuffle: bool = True,
                 pad_multiple: int = 1) -> None:
        if pad_multiple < 1:
            raise ValueError(f"pad_multiple must be >= 1, got {pad_multiple}")
        self.pairs, self.seq_len, self.pad_id, self.pad_multiple = list(pairs), seq_len, pad_id, pad_multiple
        longest = max((len(e.ids) for p in self.pairs for e in (p.chosen, p.rejected)), default=0)
        if longest > seq_len:
            raise DataError(f"a preference sequence has {longest} tokens, more than seq_len {seq_len}; "
                            "truncate pairs first (encode_pairs)")
        sides = [e for p in self.pairs for e in (p.chosen, p.rejected)]
        self.labelled = bool(self.pairs) and self.pairs[0].label is not None  # KTO items (encode_unpaired)
        tag = "preference" + ("".join("1" if p.label else "0" for p in self.pairs) if self.labelled else "")
        self._order = _Order("preference", len(self.pairs), _fingerprint(sides, tag), seq_len,
                             global_batch_size, dp_rank, dp_size, seed, shuffle)

    def next_batch(self) -> dict[str, torch.Tensor]:
        return self.batch_for(self._order.next_items())

    def batch_for(self, items: Sequence[int]) -> dict[str, torch.Tensor]:
        """The batch of pairs ``items`` (indices into ``pairs``), laid out as next_batch's."""
        picked = [self.pairs[i] for i in items]
        sides = [p.chosen for p in picked] + [p.rejected for p in picked]
        T = self.width(max((len(e.ids) for e in sides), default=1))
        batch = {
            "input_ids": np.full((len(sides), T), self.pad_id, dtype=np.int64),
            "labels": np.full((len(sides), T), IGNORE_INDEX, dtype=np.int64),
            "attention_mask": np.zeros((len(sides), T), dtype=bool),
            "position_ids": np.tile(np.arange(T, dtype=np.int64), (len(sides), 1)),
            "document_ids": np.ones((len(sides), T), dtype=np.int64),
        }
        for row, enc in enumerate(sides):
            n = len(enc.ids)
            batch["input_ids"][row, :n] = enc.ids
            batch["labels"][row, :n] = row_labels(enc)
            batch["attention_mask"][row, :n] = True
            batch["document_ids"][row, :n] = 0
        out = {k: torch.from_numpy(v) for k, v in batch.items()}  # (2B, T) each
        out["prompt_lengths"] = torch.tensor([p.prompt_len for p in picked] * 2, dtype=torch.long)  # (2B,)
        out["lengths"] = torch.tensor([len(e.ids) for e in sides], dtype=torch.long)  # (2B,)
        out["index"] = torch.tensor(list(items) * 2, dtype=torch.long)  # (2B,) each row's pair number
        if self.labelled:  # KTO: (2B,) the item's label on both its rows
            out["desirable"] = torch.tensor([bool(p.label) for p in picked] * 2, dtype=torch.bool)
        return out

    def width(self, longest: int) -> int:
        """A batch's T: its longest sequence rounded up to ``pad_multiple`` (sequence parallelism splits T over the
        tp ranks), never above ``seq_len`` (the constructor checked that every sequence fits it)."""
        return min(-(-max(longest, 1) // self.pad_multiple) * self.pad_multiple, self.seq_len)


class PromptLoader(_OrderedLoader):
    """Batches of prompts to generate from (module docstring for the layout)."""

    def __init__(self, prompts: Sequence[Sequence[int]], global_batch_size: int, *,
                 extras: Sequence[dict] | None = None, max_prompt_tokens: int, dp_rank: int = 0, dp_size: int = 1,
                 seed: int = 0, shuffle: bool = True) -> None:
        self.prompts = [list(p) for p in prompts]
        self.extras = list(extras) if extras is not None else [{} for _ in self.prompts]
        if len(self.extras) != len(self.prompts):
            raise ValueError(f"{len(self.extras)} extras for {len(self.prompts)} prompts")
        longest = max((len(p) for p in self.prompts), default=0)
        if longest > max_prompt_tokens:
            raise DataError(f"a prompt has {longest} tokens, more than {max_prompt_tokens}; truncate prompts first "
                            "(encode_prompts)")
        sides = [Encoded(p, [False] * len(p)) for p in self.prompts]
        self._order = _Order("prompt", len(self.prompts), _fingerprint(sides, "prompt"), max_prompt_tokens,
                             global_batch_size, dp_rank, dp_size, seed, shuffle)

    def next_batch(self) -> dict[str, list]:
        items = self._order.next_items()
        return {"prompt_ids": [list(self.prompts[i]) for i in items], "extra": [self.extras[i] for i in items],
                "index": items}


def _fingerprint(examples: Sequence[Encoded], tag: str) -> str:
    """sha256 of the encoded data: a resumed run must see the same tokens and masks."""
    h = hashlib.sha256(tag.encode())
    for e in examples:
        h.update(np.asarray(e.ids, dtype=np.int64).tobytes())
        h.update(np.packbits(np.asarray(e.loss_mask, dtype=bool)).tobytes())
        h.update(len(e.ids).to_bytes(8, "little"))
    return h.hexdigest()
