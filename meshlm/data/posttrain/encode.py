"""Rows to token ids and loss masks, with the truncation policy (see docs/post-training.md).

Plain-text rows, exactly: ``[bos where the tokenizer adds one] + encode(prompt) + encode(completion) + [eos]``,
each part encoded separately with no special tokens added; the loss covers the completion tokens and the eos.
Conversations (and preference/prompt rows given as messages) go through a chat template (templates.py).

Truncation, for a sequence longer than ``max_tokens``: the *prompt* is everything before the first loss token,
the *response* everything from it on. The prompt keeps its end (and its leading bos): it keeps
``max(max_tokens - len(response), min(len(prompt), max_tokens // 2))`` tokens, then the response keeps its start
up to ``max_tokens`` (a cut response loses its eos). A preference pair cuts its shared prompt once, to fit the
longer response, so chosen and rejected keep the same prompt. Truncated rows and dropped tokens are counted; a
row left with no loss token is dropped and counted.

KTO items (``encode_unpaired``): each unpaired row, or each side of a preference row, is one item; its second
sequence is the KL row: its prompt with the completion of the item before it in data order (the first takes the
last's), TRL's mismatched pairs but fixed by the data, not by who shares a batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from meshlm.data.posttrain.rows import Message, Row, Text
from meshlm.data.posttrain.templates import ChatTemplate, Encoded, chat_template_for
from meshlm.errors import DataError
from meshlm.tokenizer import MeshTokenizer


@dataclass
class EncodeStats:
    """What encoding kept, cut and dropped (all counts)."""

    rows: int = 0
    examples: int = 0
    truncated_rows: int = 0
    truncated_tokens: int = 0  # tokens removed by truncation
    dropped_no_loss_tokens: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    dropped_examples: list[str] = field(default_factory=list)  # first few "file:line" of dropped rows

    def drop(self, where: str) -> None:
        self.dropped_no_loss_tokens += 1
        if len(self.dropped_examples) < 5:
            self.dropped_examples.append(where)


@dataclass
class PreferencePair:
    """A chosen and a rejected sequence sharing their first ``prompt_len`` tokens."""

    chosen: Encoded
    rejected: Encoded
    prompt_len: int
    where: str
    label: bool | None = None  # KTO items: chosen = the row, rejected = its KL row, label = desirable


class RowEncoder:
    """Encodes rows with one tokenizer; the chat template is looked up on first use (only chats need one)."""

    def __init__(self, tokenizer: MeshTokenizer, tokenizer_dir: str | Path | None = None,
                 template: ChatTemplate | None = None) -> None:
        self.tokenizer, self.tokenizer_dir, self._template = tokenizer, tokenizer_dir, template

    @property
    def template(self) -> ChatTemplate:
        if self._template is None:
            self._template = chat_template_for(self.tokenizer, self.tokenizer_dir)
        return self._template

    def prompt_completion(self, prompt: str, completion: str) -> Encoded:
        """The plain-text rule (module docstring)."""
        tok = self.tokenizer
        head = tok.prompt_ids(prompt)  # bos only where the tokenizer adds one
        tail = tok.encode(completion) + [tok.eos_id]
        return Encoded(head + tail, [False] * len(head) + [True] * len(tail))

    def example(self, row: Row) -> Encoded:
        """An SFT row: a conversation or a prompt/completion pair."""
        if row.kind == "conversation":
            return self.template.encode(row.messages, where=row.where)
        if row.kind == "prompt_completion":
            return self.prompt_completion(row.prompt, row.completion)
        raise DataError(f"{row.where}: a {row.kind} row cannot be used for supervised fine-tuning")

    def pair(self, row: Row) -> tuple[Encoded, Encoded]:
        """A preference row: (chosen, rejected). Messages anywhere in the row mean the chat template is used."""
        if row.kind != "preference":
            raise DataError(f"{row.where}: a {row.kind} row is not a preference row (prompt, chosen, rejected)")
        if all(isinstance(x, str) for x in (row.prompt, row.chosen, row.rejected)):
            return self.prompt_completion(row.prompt, row.chosen), self.prompt_completion(row.prompt, row.rejected)
        prompt = _as_messages(row.prompt, "user")
        encode = self.template.encode
        return tuple(encode(prompt + _as_messages(answer, "assistant"), loss_from=len(prompt), where=row.where)
                     for answer in (row.chosen, row.rejected))

    def prompt_and_completion(self, prompt: Text, completion: Text, where: str) -> Encoded:
        """Plain text by the plain-text rule; messages anywhere mean the chat template (loss on the completion)."""
        if isinstance(prompt, str) and isinstance(completion, str):
            return self.prompt_completion(prompt, completion)
        messages = _as_messages(prompt, "user")
        return self.template.encode(messages + _as_messages(completion, "assistant"), loss_from=len(messages),
                                    where=where)

    def prompt(self, row: Row) -> list[int]:
        """A prompt to generate from (PPO/GRPO): ``tokenizer.prompt_ids(prompt)`` (bos where the tokenizer adds one),
        or the chat prompt for messages."""
        if row.prompt is None:
            raise DataError(f"{row.where}: a {row.kind} row has no prompt")
        if isinstance(row.prompt, str):
            return self.tokenizer.prompt_ids(row.prompt)
        return self.template.encode_prompt(row.prompt, where=row.where)


def check_vocab(tokenizer: MeshTokenizer, model_vocab_size: int, source: str) -> None:
    """Refuse a tokenizer whose ids do not all have a row in the model's embedding (``source`` names it)."""
    if tokenizer.vocab_size > model_vocab_size:
        raise DataError(f"tokenizer {source} has {tokenizer.vocab_size} tokens but the model's embedding has "
                        f"{model_vocab_size} rows (model.vocab_size); use the tokenizer the model was trained or "
                        "converted with (with checkpoint.init_from, the checkpoint's tokenizer.json)")


def encode_examples(rows: Sequence[Row], encoder: RowEncoder, max_tokens: int) -> tuple[list[Encoded], EncodeStats]:
    """SFT rows, truncated to ``max_tokens``; rows without a loss token left are dropped (counted)."""
    stats = EncodeStats(rows=len(rows))
    out = []
    for row in rows:
        enc = encoder.example(row)
        first = _first_loss(enc)
        if first is not None and len(enc.ids) > max_tokens:
            keep = _prompt_keep(first, len(enc.ids) - first, max_tokens)
            enc = _cut(enc, first, keep, max_tokens, encoder.tokenizer.bos_id, stats)
        if _first_loss(enc) is None:
            stats.drop(row.where)
            continue
        out.append(enc)
        _count(stats, enc)
    return out, stats


def encode_pairs(rows: Sequence[Row], encoder: RowEncoder, max_tokens: int) -> tuple[list[PreferencePair],
                                                                                     EncodeStats]:
    """Preference rows, each side truncated to ``max_tokens`` with one shared prompt cut (module docstring)."""
    stats = EncodeStats(rows=len(rows))
    out = []
    for row in rows:
        chosen, rejected = encoder.pair(row)
        first_c, first_r = _first_loss(chosen), _first_loss(rejected)
        if first_c is None or first_r is None:
            stats.drop(row.where)
            continue
        if first_c != first_r or chosen.ids[:first_c] != rejected.ids[:first_r]:
            raise DataError(f"{row.where}: chosen and rejected do not share their prompt tokens; the chat template "
                            "renders the prompt differently depending on the reply, which is not supported")
        if max(len(chosen.ids), len(rejected.ids)) > max_tokens:
            response = max(len(chosen.ids), len(rejected.ids)) - first_c
            keep = _prompt_keep(first_c, response, max_tokens)
            bos = encoder.tokenizer.bos_id
            chosen, rejected = (_cut(e, first_c, keep, max_tokens, bos, stats) for e in (chosen, rejected))
            stats.truncated_rows -= 1  # one row, counted once
        if _first_loss(chosen) is None or _first_loss(rejected) is None:
            stats.drop(row.where)
            continue
        out.append(PreferencePair(chosen, rejected, _first_loss(chosen), row.where))
        _count(stats, chosen)
        _count(stats, rejected)
    stats.examples = len(out)
    return out, stats


def encode_unpaired(rows: Sequence[Row], encoder: RowEncoder, max_tokens: int) -> tuple[list[PreferencePair],
                                                                                        EncodeStats]:
    """KTO items (module docstring): unpaired rows, and preference rows as a desirable and an undesirable item
    (TRL's unpairing). Each sequence is truncated on its own; an item whose row keeps no loss token is dropped."""
    stats = EncodeStats(rows=len(rows))
    items: list[tuple[Text, Text, bool, str]] = []
    for row in rows:
        if row.kind == "unpaired":
            items.append((row.prompt, row.completion, bool(row.label), row.where))
        elif row.kind == "preference":
            items += [(row.prompt, row.chosen, True, row.where), (row.prompt, row.rejected, False, row.where)]
        else:
            raise DataError(f"{row.where}: a {row.kind} row is neither unpaired (prompt, completion, label) nor a "
                            "preference row, which KTO reads")
    out = []
    for i, (prompt, completion, label, where) in enumerate(items):
        real = _truncated(encoder.prompt_and_completion(prompt, completion, where), encoder, max_tokens, stats)
        other = items[i - 1][1]  # the previous item's completion (i = 0 takes the last's)
        kl = _truncated(encoder.prompt_and_completion(prompt, other, where), encoder, max_tokens, stats)
        if _first_loss(real) is None:
            stats.drop(where)
            continue
        out.append(PreferencePair(real, kl, _first_loss(real), where, label))
        _count(stats, real)
    stats.examples = len(out)
    return out, stats


def _truncated(enc: Encoded, encoder: RowEncoder, max_tokens: int, stats: EncodeStats) -> Encoded:
    first = _first_loss(enc)
    if first is None or len(enc.ids) <= max_tokens:
        return enc
    keep = _prompt_keep(first, len(enc.ids) - first, max_tokens)
    return _cut(enc, first, keep, max_tokens, encoder.tokenizer.bos_id, stats)


def encode_prompts(rows: Sequence[Row], encoder: RowEncoder, max_tokens: int) -> tuple[list[list[int]], EncodeStats]:
    """Prompts for generation; a longer prompt keeps its end (and its leading bos)."""
    stats = EncodeStats(rows=len(rows))
    out = []
    bos = encoder.tokenizer.bos_id
    for row in rows:
        ids = encoder.prompt(row)
        if len(ids) > max_tokens:
            head = ids[:1] if bos is not None and ids[0] == bos else []
            stats.truncated_rows += 1
            stats.truncated_tokens += len(ids) - max_tokens
            ids = head + ids[len(ids) - (max_tokens - len(head)):]
        out.append(ids)
        stats.tokens += len(ids)
    stats.examples = len(out)
    return out, stats


def _as_messages(text: Text, role: str) -> list[Message]:
    return [{"role": role, "content": text}] if isinstance(text, str) else list(text)


def _first_loss(enc: Encoded) -> int | None:
    """Index of the first loss token that can be a target (token 0 never is: nothing precedes it)."""
    for i in range(1, len(enc.loss_mask)):
        if enc.loss_mask[i]:
            return i
    return None


def _prompt_keep(prompt_len: int, response_len: int, max_tokens: int) -> int:
    """How many prompt tokens survive truncation (module docstring); at least one, so a target has an input."""
    return max(1, min(prompt_len, max(max_tokens - response_len, max_tokens // 2)))


def _cut(enc: Encoded, first: int, keep: int, max_tokens: int, bos_id: int | None, stats: EncodeStats) -> Encoded:
    """Keep ``keep`` prompt tokens (the leading bos and the prompt's end), then the response up to max_tokens."""
    head = 1 if bos_id is not None and enc.ids[0] == bos_id and keep > 1 else 0
    prompt = list(range(head)) + list(range(first - (keep - head), first))
    response = list(range(first, min(len(enc.ids), first + max_tokens - keep)))
    index = prompt + response
    stats.truncated_rows += 1
    stats.truncated_tokens += len(enc.ids) - len(index)
    return Encoded([enc.ids[i] for i in index], [enc.loss_mask[i] for i in index])


def _count(stats: EncodeStats, enc: Encoded) -> None:
    stats.examples += 1
    stats.tokens += len(enc.ids)
    stats.loss_tokens += sum(enc.loss_mask[1:])
