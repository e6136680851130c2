"""Per-row pieces of batched decoding: each row's own changes to the logits (logit bias, presence/frequency
penalties, a grammar's token mask), sampling with its own temperature / top-p / seed, its log-probs, and turning
a growing list of token ids into text deltas that respect stop strings.

Log-probs are those of the model: log-softmax of the raw logits at the chosen token, before bias, penalties,
masks, temperature and top-p (what vLLM returns by default), so they can be checked against a plain forward.

Text is re-decoded from all generated ids at each step (byte-level BPE: a character may span tokens, so decoding
tokens one at a time would split multi-byte characters). What is sent is held back while it ends in an
incomplete character (U+FFFD) or in a prefix of a stop string, so a client never receives text that a stop string
later removes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol

import torch

from meshlm.generate.rollout import inverse_cdf
from meshlm.serve.protocol import Sampling, TokenLogprob
from meshlm.tokenizer import MeshTokenizer


class TokenMask(Protocol):
    """A per-row constraint (a grammar): which tokens may come next, told each token that came."""

    def allowed(self, vocab_size: int, device: torch.device) -> torch.Tensor: ...  # (V,) bool

    def advance(self, token: int) -> None: ...

    @property
    def complete(self) -> bool: ...  # nothing but the end may follow


class RowLogits:
    """One row's changes to its logits before sampling. OpenAI's penalties: logit[j] -= c[j] * frequency +
    (c[j] > 0) * presence, c[j] the count of token j among the tokens generated so far (not the prompt);
    ``logit_bias`` is added as given (-100 bans a token, +100 all but forces it)."""

    def __init__(self, sampling: Sampling, vocab_size: int, device: torch.device,
                 mask: TokenMask | None = None) -> None:
        self.presence, self.frequency = sampling.presence_penalty, sampling.frequency_penalty
        self.bias: torch.Tensor | None = None
        if sampling.logit_bias:
            self.bias = torch.zeros(vocab_size, device=device)
            ids, values = zip(*sampling.logit_bias)
            self.bias[list(ids)] = torch.tensor(values, device=device)
        self.counts = torch.zeros(vocab_size, device=device) if (self.presence or self.frequency) else None
        self.mask = mask

    @classmethod
    def for_request(cls, sampling: Sampling, vocab_size: int, device: torch.device,
                    mask: TokenMask | None = None) -> RowLogits | None:
        """None when nothing changes the logits (the common case costs nothing)."""
        row = cls(sampling, vocab_size, device, mask)
        return row if (row.bias is not None or row.counts is not None or mask is not None) else None

    def apply(self, logits: torch.Tensor) -> None:
        """Change one row's (V,) fp32 logits in place."""
        if self.bias is not None:
            logits += self.bias[:logits.shape[0]]
        if self.counts is not None:
            counts = self.counts[:logits.shape[0]]
            logits -= counts * self.frequency + (counts > 0).float() * self.presence
        if self.mask is not None:
            logits.masked_fill_(~self.mask.allowed(logits.shape[0], logits.device), float("-inf"))

    def observe(self, token: int) -> None:
        if self.counts is not None:
            self.counts[token] += 1
        if self.mask is not None:
            self.mask.advance(token)

    @property
    def complete(self) -> bool:
        return self.mask is not None and self.mask.complete


class RowError(Exception):
    """One row could not be sampled (its grammar raised, or its changes left no token to sample): that row fails,
    the others in the batch go on."""


def pick_tokens(logits: torch.Tensor, temperatures: Sequence[float], top_ps: Sequence[float],
                generators: Sequence[torch.Generator | None], adjust: Sequence[RowLogits | None],
                top_logprobs: Sequence[int | None], vocab_limit: int | None = None
                ) -> tuple[list[int], list[tuple[float, list[tuple[int, float]]] | None], dict[int, Exception]]:
    """One token per row of (B, V) logits after each row's ``adjust``, and for rows whose ``top_logprobs`` is
    not None the model's log-prob of that token with the k most likely (token, log-prob) pairs; and the rows
    that failed (row -> error): their token is meaningless and must not be used."""
    raw = logits.float()
    if vocab_limit is not None and vocab_limit < raw.shape[-1]:
        raw = raw[:, :vocab_limit]  # ids past the tokenizer never come out
    logp = torch.log_softmax(raw, dim=-1) if any(k is not None for k in top_logprobs) else None  # (B, V)
    chosen, failed = raw, {}
    if any(a is not None for a in adjust):
        chosen = raw.clone()
        for row, a in enumerate(adjust):
            if a is None:
                continue
            try:
                a.apply(chosen[row])
            except Exception as exc:  # this row's grammar (or bias) broke: fail it alone
                failed[row] = exc
            else:
                if not bool(torch.isfinite(chosen[row]).any()):
                    failed[row] = RowError("no token is allowed after this row's logit_bias and grammar")
        for row in failed:
            chosen[row] = raw[row]  # any finite row: the batch samples on, the token is dropped
    tokens = sample_rows(chosen, temperatures, top_ps, generators)
    infos: list[tuple[float, list[tuple[int, float]]] | None] = [None] * len(tokens)
    for row, k in enumerate(top_logprobs):
        if k is not None:
            top = torch.topk(logp[row], k) if k else None
            pairs = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
            infos[row] = (float(logp[row, tokens[row]]), pairs)
    return tokens, infos, failed


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


def choice_seed(seed: int | None, index: int) -> int | None:
    """Choice 0 uses the request's seed; choice i > 0 one derived from it (so n samples differ, and repeat)."""
    if seed is None or index == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:7], "little")


def sample_rows(logits: torch.Tensor, temperatures: Sequence[float], top_ps: Sequence[float],
                generators: Sequence[torch.Generator | None], vocab_limit: int | None = None) -> list[int]:
    """One token per row of (B, V) logits. Temperature 0 is greedy; otherwise the row samples from
    softmax(logits / T) restricted to its top-p nucleus by inverse CDF with one fp64 uniform drawn from its own
    generator (its seed). One uniform a row, not ``torch.multinomial``, which draws one exponential per vocabulary
    entry from the generator (SmolLM2's 49k: ~1.8 ms a row, 29 ms a step of 16 sampled rows — a third of an int8
    decode step — against ~2 ms for the whole batch here)."""
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
    sampled = (~greedy).nonzero().squeeze(1).tolist()
    probs = torch.softmax(scaled[sampled], dim=-1)  # (S, V)
    uniforms = torch.cat([torch.rand(1, generator=generators[row], dtype=torch.float64) for row in sampled])
    out = tokens.tolist()
    for row, token in zip(sampled, inverse_cdf(probs, uniforms.to(probs.device)).tolist()):
        out[row] = token
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
