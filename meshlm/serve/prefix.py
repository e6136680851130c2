"""A prefix cache: the keys and values of prompts already prefilled, reused by later prompts that start the same.

Chat traffic repeats itself: every request of an application carries its system prompt, and every turn of a
conversation carries the turns before it. The keys and values of a prompt's first L tokens depend on those L
tokens alone (causal attention), so a later prompt that starts with the same L tokens can copy them and prefill
only the rest: its first token comes after a forward over the new tokens, not the whole prompt.

- What is kept: each prefilled prompt's keys and values, per layer (Hkv, P, Dh), on the engine's device, under a
  byte budget (least recently used out first). A prompt that extends a kept one replaces it (it covers it).
- What is found: the longest common prefix with any kept prompt — a whole kept prompt (the next turn of a
  chat) or part of one (another user's request with the same system prompt) — if it is at least
  ``min_tokens`` long; at least one token is left to prefill, whose logits choose the first new token.
- What is not: rows with a LoRA adapter (their keys depend on the adapter, and a slot can be reloaded with
  another) and prompts whose own logits are asked for (echo with logprobs) — those prefill whole.

Reused keys were computed in another forward (another batch shape, possibly beside padded rows), so the logits
agree with a whole prefill to float rounding, not bit for bit (tests/test_serve_prefix.py measures it;
docs/serving.md "Prefix cache").
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass
class _Entry:
    tokens: torch.Tensor  # (P,) int64, on the CPU
    keys: list[torch.Tensor]  # per layer (Hkv, P, Dh)
    values: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


class PrefixCache:
    """Kept prompts' keys and values under ``max_bytes`` (module docstring); used by the engine thread only."""

    def __init__(self, max_bytes: int, min_tokens: int = 16) -> None:
        self.max_bytes, self.min_tokens = max_bytes, min_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._next = 0
        self.bytes = 0
        self.stats = {"lookups": 0, "hits": 0, "tokens_reused": 0, "stored": 0, "evicted": 0, "errors": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, prompt: list[int]) -> tuple[int, list[torch.Tensor], list[torch.Tensor]] | None:
        """The longest usable kept prefix of ``prompt``: (L, keys, values) with per-layer (Hkv, L, Dh) views, or
        None. L < len(prompt) (the last token is always prefilled)."""
        self.stats["lookups"] += 1
        if len(prompt) <= self.min_tokens or not self._entries:
            return None
        want = torch.tensor(prompt, dtype=torch.long)
        best, best_id = 0, None
        for key, entry in self._entries.items():
            n = min(len(entry.tokens), len(want) - 1)
            if n < self.min_tokens or n <= best:
                continue
            same = entry.tokens[:n] == want[:n]
            common = n if bool(same.all()) else int(same.long().argmin())
            if common > best:
                best, best_id = common, key
        if best < self.min_tokens:
            return None
        entry = self._entries[best_id]
        self._entries.move_to_end(best_id)
        self.stats["hits"] += 1
        self.stats["tokens_reused"] += best
        return best, [k[:, :best] for k in entry.keys], [v[:, :best] for v in entry.values]

    def store(self, prompt: list[int], keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Keep ``prompt``'s per-layer keys and values (Hkv, P, Dh) (copied); kept prompts it extends leave."""
        if len(prompt) <= self.min_tokens:
            return
        entry = _Entry(torch.tensor(prompt, dtype=torch.long), [k.contiguous().clone() for k in keys],
                       [v.contiguous().clone() for v in values])
        if entry.nbytes > self.max_bytes or any(
                len(e.tokens) >= len(entry.tokens) and torch.equal(e.tokens[:len(entry.tokens)], entry.tokens)
                for e in self._entries.values()):  # too big, or a kept prompt already starts with all of it
            return
        covered = [key for key, e in self._entries.items()
                   if len(e.tokens) <= len(entry.tokens) and torch.equal(e.tokens, entry.tokens[:len(e.tokens)])]
        for key in covered:
            self._drop(key)
        while self._entries and self.bytes + entry.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
            self.stats["evicted"] += 1
        self._entries[self._next] = entry
        self._next += 1
        self.bytes += entry.nbytes
        self.stats["stored"] += 1

    def clear(self) -> None:
        for key in list(self._entries):
            self._drop(key)

    def _drop(self, key: int) -> None:
        self.bytes -= self._entries.pop(key).nbytes

    def status(self) -> dict[str, int]:
        return {**self.stats, "entries": len(self._entries), "bytes": self.bytes, "max_bytes": self.max_bytes}
