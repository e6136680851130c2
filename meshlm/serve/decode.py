"""The server's side of batched decoding: tokens picked by the one sampler (meshlm/generate/sampling.py: each
row's bias, penalties, grammar mask, temperature, top-k/top-p/min-p and seed), the log-probs a request asks for,
and turning a growing list of token ids into text deltas that respect stop strings.

Log-probs are those of the model: log-softmax of the raw logits at the chosen token, before bias, penalties,
masks, temperature and top-p (what vLLM returns by default), so they can be checked against a plain forward.

Text is re-decoded from all generated ids at each step (byte-level BPE: a character may span tokens, so decoding
tokens one at a time would split multi-byte characters). What is sent is held back while it ends in an
incomplete character (U+FFFD) or in a prefix of a stop string, so a client never receives text that a stop string
later removes.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from meshlm.generate.sampling import RowSampler, sample
from meshlm.serve.protocol import TokenLogprob
from meshlm.tokenizer import MeshTokenizer


def pick_tokens(logits: torch.Tensor, rows: Sequence[RowSampler], top_logprobs: Sequence[int | None],
                vocab_limit: int | None = None
                ) -> tuple[list[int], list[tuple[float, list[tuple[int, float]]] | None], dict[int, Exception]]:
    """One token per row of (B, V) logits by the one sampler (meshlm/generate/sampling.py), and for rows whose
    ``top_logprobs`` is not None the model's log-prob of that token with the k most likely (token, log-prob)
    pairs; and the rows that failed (row -> error): their token is meaningless and must not be used."""
    raw = logits.float()
    if vocab_limit is not None and vocab_limit < raw.shape[-1]:
        raw = raw[:, :vocab_limit]  # ids past the tokenizer never come out
    picked = sample(raw, rows)
    tokens = picked.tokens.tolist()
    infos: list[tuple[float, list[tuple[int, float]]] | None] = [None] * len(tokens)
    if any(k is not None for k in top_logprobs):
        logp = torch.log_softmax(raw, dim=-1)  # (B, V): the model's, before the rows' changes
        for row, k in enumerate(top_logprobs):
            if k is not None:
                top = torch.topk(logp[row], k) if k else None
                pairs = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
                infos[row] = (float(logp[row, tokens[row]]), pairs)
    return tokens, infos, picked.failed


def prompt_logprobs(logits: torch.Tensor, prompt: Sequence[int], k: int) -> list[tuple[float, list]] :
    """(L, V) logits of a prompt's positions -> for prompt tokens 1.. their log-prob and top-k (the first token
    has none)."""
    logp = torch.log_softmax(logits[:-1].float(), dim=-1)  # position t predicts token t + 1
    target = torch.as_tensor(list(prompt[1:]), device=logits.device)
    chosen = logp.gather(1, target[:, None]).squeeze(1).tolist()
    top = torch.topk(logp, k) if k else None
    return [(chosen[t], list(zip(top.indices[t].tolist(), top.values[t].tolist())) if top is not None else [])
            for t in range(len(chosen))]


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character each byte is written as inside a token string."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def token_piece(tokenizer: MeshTokenizer, token: int) -> tuple[str, tuple[int, ...]]:
    """A token's text and its exact bytes (a byte-level BPE token may hold part of a character)."""
    raw = tokenizer.backend.id_to_token(token) if hasattr(tokenizer, "backend") else None
    table = _byte_decoder()
    if raw is not None and raw not in tokenizer.special_ids and all(ch in table for ch in raw):
        data = bytes(table[ch] for ch in raw)
    else:
        data = tokenizer.decode([token]).encode("utf-8")
    return data.decode("utf-8", errors="replace"), tuple(data)


def token_logprob(tokenizer: MeshTokenizer, token: int, info: tuple[float | None, list[tuple[int, float]]]
                  ) -> TokenLogprob:
    text, data = token_piece(tokenizer, token)
    top = tuple((*token_piece(tokenizer, t), lp) for t, lp in info[1])
    return TokenLogprob(text, data, info[0], top)


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
