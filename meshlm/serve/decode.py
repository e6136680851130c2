"""Per-row pieces of batched decoding: sampling with each request's own temperature / top-p / seed, and turning
a growing list of token ids into text deltas that respect stop strings.

Text is re-decoded from all generated ids at each step (byte-level BPE: a character may span tokens, so decoding
tokens one at a time would split multi-byte characters). What is sent is held back while it ends in an
incomplete character (U+FFFD) or in a prefix of a stop string, so a client never receives text that a stop string
later removes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from meshlm.tokenizer import MeshTokenizer


def sample_rows(logits: torch.Tensor, temperatures: Sequence[float], top_ps: Sequence[float],
                generators: Sequence[torch.Generator | None], vocab_limit: int | None = None) -> list[int]:
    """One token per row of (B, V) logits. Temperature 0 is greedy; otherwise the row samples from
    softmax(logits / T) restricted to its top-p nucleus, with its own generator (its seed)."""
    logits = logits.float()
    if vocab_limit is not None and vocab_limit < logits.shape[-1]:
        logits[:, vocab_limit:] = float("-inf")
    temps = torch.tensor(temperatures, dtype=torch.float32, device=logits.device)  # (B,)
    greedy = temps <= 0
    tokens = logits.argmax(-1)  # (B,)
    if bool(greedy.all()):
        return tokens.tolist()
    scaled = logits / torch.where(greedy, 1.0, temps)[:, None]  # (B, V)
    top_p = torch.tensor(top_ps, dtype=torch.float32, device=logits.device).clamp(min=1e-6)  # (B,)
    if bool((top_p < 1).any()):
        ordered, order = torch.sort(scaled, dim=-1, descending=True)  # (B, V)
        probs = torch.softmax(ordered, dim=-1)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p[:, None]  # mass ranked strictly above >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)  # (B, V)
    out = tokens.tolist()
    for row in range(len(out)):
        if not bool(greedy[row]):
            out[row] = int(torch.multinomial(probs[row], 1, generator=generators[row]))
    return out


class TextStream:
    """Generated ids -> text deltas, stopping at the first stop string (which is not part of the text)."""

    def __init__(self, tokenizer: MeshTokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.sent = 0  # characters of the text already returned as deltas
        self.stopped = False
        self._longest = max((len(s) for s in self.stop), default=0)

    def push(self, token: int) -> str:
        """Add a token; return the new text that is safe to send (may be empty). Sets ``stopped`` when a stop
        string appeared (the text then ends before it)."""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if self.stop:
            start = max(0, self.sent - self._longest + 1)
            hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.stopped = True
                return self._take(text[:min(hits)])
        return self._take(text[:len(text) - self._held_back(text)])

    def flush(self) -> str:
        """At the end: everything not yet sent (an incomplete character at the very end stays as decoded)."""
        if self.stopped:
            return ""
        return self._take(self.tokenizer.decode(self.ids, skip_special_tokens=True))

    def _take(self, upto: str) -> str:
        delta = upto[self.sent:]
        self.sent = max(self.sent, len(upto))
        return delta

    def _held_back(self, text: str) -> int:
        """Characters at the end that may still change: an incomplete character, or the start of a stop string."""
        hold = 1 if text.endswith("\ufffd") else 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:n]):
                    hold = max(hold, n)
                    break
        return hold
