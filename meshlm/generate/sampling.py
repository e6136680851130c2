"""The one sampler, and ``generate()``: one sequence continued with the KV cache.

Every caller that picks tokens — :func:`generate`, :func:`meshlm.generate.rollout.rollout` (PPO/GRPO rollouts, the
safety generator) and the server's engine (meshlm/serve/engine.py) — calls :func:`sample` on a batch of
:class:`RowSampler` rows, each holding one row's :class:`~meshlm.generate.params.SamplingParams`, its logit
changes (bias, penalties, an optional token mask such as a grammar) and its own generator. The rule, per row:

1. logits past ``vocab_limit`` (embedding rows beyond the tokenizer) are -inf; the row's changes apply;
2. temperature 0: the argmax;
3. otherwise logits / temperature, cut to the top-k (ties with the k-th kept), to the top-p nucleus (a token is
   dropped when the tokens ranked above it already hold top_p of the mass: the most likely always survives) and
   to min-p (below min_p × the most likely token's probability), then one token by inverse CDF from ONE fp64
   uniform of the row's generator (:func:`inverse_cdf`).

One uniform a row and step, from a CPU generator seeded by the row's seed, makes a row's tokens a function of its
seed and its logits alone: the same whether it decodes alone or batched with others, on one rank or another, in
``generate()``, ``rollout()`` or the server (tests/test_decoding_core.py). ``torch.multinomial`` instead draws one
exponential per vocabulary entry from the generator (SmolLM2's 49k: ~1.8 ms a row, 29 ms a step of 16 sampled
rows, against ~2 ms for the whole batch here).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from meshlm.errors import ConfigError
from meshlm.generate.decode import fast_forward
from meshlm.generate.params import SamplingError, SamplingParams
from meshlm.models.llama import Transformer


class TokenMask(Protocol):
    """A per-row constraint (a grammar): which tokens may come next, told each token that came."""

    def allowed(self, vocab_size: int, device: torch.device) -> torch.Tensor: ...  # (V,) bool

    def advance(self, token: int) -> None: ...

    @property
    def complete(self) -> bool: ...  # nothing but the end may follow


class RowError(Exception):
    """One row could not be sampled (its mask raised, or its changes left no token): that row fails alone."""


def _random_seed() -> int:
    return int.from_bytes(os.urandom(7), "little")


def row_seed(seed: int | None, index: int) -> int | None:
    """The seed of row ``index`` of a request seeded ``seed``: row 0 uses ``seed`` itself (so one row samples the
    same in every caller), row i > 0 one derived from it (so n samples differ, and repeat)."""
    if seed is None or index == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:7], "little")


class RowSampler:
    """One row's sampling state: its params, its generator (CPU, seeded by ``seed``, else ``params.seed``, else a
    fresh random seed; none for greedy rows or ``own_generator=False``, whose uniforms the caller passes), its
    logit bias and penalty counts (OpenAI's: logit[j] -= c[j] * frequency + (c[j] > 0) * presence, c[j] the count
    of token j among the tokens generated so far) and an optional token mask."""

    def __init__(self, params: SamplingParams, vocab_size: int, device: torch.device | str = "cpu", *,
                 seed: int | None = None, mask: TokenMask | None = None, own_generator: bool = True) -> None:
        self.params, self.mask = params, mask
        self.generator: torch.Generator | None = None
        if own_generator and not params.greedy:
            seed = seed if seed is not None else params.seed
            self.generator = torch.Generator(device="cpu").manual_seed(seed if seed is not None else _random_seed())
        self.bias: torch.Tensor | None = None
        if params.logit_bias:
            ids, values = zip(*params.logit_bias)
            if max(ids) >= vocab_size:
                raise SamplingError("logit_bias", f"token id {max(ids)} is outside the vocabulary [0, {vocab_size})")
            self.bias = torch.zeros(vocab_size, device=device)
            self.bias[list(ids)] = torch.tensor(values, device=device)
        penalised = params.presence_penalty or params.frequency_penalty
        self.counts = torch.zeros(vocab_size, device=device) if penalised else None

    @property
    def changes_logits(self) -> bool:
        return self.bias is not None or self.counts is not None or self.mask is not None

    def adjust(self, logits: torch.Tensor) -> None:
        """Change this row's (V,) fp32 logits in place: bias, penalties, mask."""
        V = logits.shape[0]
        if self.bias is not None:
            logits += self.bias[:V]
        if self.counts is not None:
            counts = self.counts[:V]
            logits -= counts * self.params.frequency_penalty + (counts > 0).float() * self.params.presence_penalty
        if self.mask is not None:
            logits.masked_fill_(~self.mask.allowed(V, logits.device), float("-inf"))

    def observe(self, token: int) -> None:
        """The row emitted ``token``: count it, advance the mask."""
        if self.counts is not None:
            self.counts[token] += 1
        if self.mask is not None:
            self.mask.advance(token)

    @property
    def complete(self) -> bool:
        return self.mask is not None and self.mask.complete

    def uniform(self) -> torch.Tensor:
        """(1,) fp64 in [0, 1) from this row's generator."""
        return torch.rand(1, generator=self.generator, dtype=torch.float64)


def filter_logits(logits: torch.Tensor, top_k: int | torch.Tensor = 0, top_p: float | torch.Tensor = 1.0,
                  min_p: float | torch.Tensor = 0.0) -> torch.Tensor:
    """Set to -inf every logit outside the top-k, then outside the top-p nucleus of what is left, then below
    min-p (module docstring); logits (..., V), each filter a number or one per row (...,). A new tensor. A number
    out of its range raises :class:`SamplingError` naming it (per-row tensors come from checked params)."""
    if not any(isinstance(v, torch.Tensor) for v in (top_k, top_p, min_p)):
        SamplingParams(top_k=top_k, top_p=top_p, min_p=min_p)  # checks the three numbers
    out = logits.clone()
    V = out.shape[-1]
    rows = out.shape[:-1]
    # which filters apply is decided where the numbers are (the host, for sample()'s per-row tensors): reading a
    # flag off a GPU tensor would wait for the device at every step
    k, p, m = (torch.as_tensor(top_k), torch.as_tensor(top_p, dtype=torch.float32),
               torch.as_tensor(min_p, dtype=torch.float32))
    any_k, any_p, any_m = bool(((k > 0) & (k < V)).any()), bool((p < 1).any()), bool((m > 0).any())
    k, p, m = (t.to(out.device, non_blocking=True).expand(rows) for t in (k, p, m))
    use_k, use_p = (k > 0) & (k < V), p < 1
    if any_k or any_p:
        ordered, order = torch.sort(out, dim=-1, descending=True)  # (..., V)
        if any_k:
            kth = ordered.gather(-1, (k.clamp(1, V) - 1)[..., None])  # (..., 1)
            cut = use_k[..., None]
            out = out.masked_fill(cut & (out < kth), float("-inf"))
            ordered = ordered.masked_fill(cut & (ordered < kth), float("-inf"))
        if any_p:
            probs = torch.softmax(ordered.float(), dim=-1)
            mass_above = probs.cumsum(dim=-1) - probs  # (..., V) mass of the tokens ranked strictly higher
            drop_sorted = (mass_above >= p[..., None]) & use_p[..., None]
            drop_sorted[..., 0] = False  # the most likely token always survives (top_p 0 keeps it alone)
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
            out = out.masked_fill(drop, float("-inf"))
    if any_m:
        probs = torch.softmax(out.float(), dim=-1)
        out = out.masked_fill(probs < m[..., None] * probs.amax(-1, keepdim=True), float("-inf"))
    return out


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """(B, V) probabilities, (B,) uniforms in [0, 1) -> (B,) the first index whose cumulative mass exceeds
    u · total, computed in fp64. The target is kept strictly below the total, so a zero-probability token (equal
    cumulative values, e.g. beyond ``vocab_limit``) is never the first to exceed it."""
    cdf = probs.double().cumsum(-1)  # (B, V)
    total = cdf[:, -1:]  # (B, 1)
    target = torch.minimum(uniforms.to(cdf)[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(1)


@dataclass
class Picked:
    """What :func:`sample` chose: ``tokens`` (B,); ``logprobs`` (B,) fp32 of each token under the distribution
    sampled from (softmax of the filtered, tempered logits; greedy rows: of the changed logits), when asked;
    ``failed``: row -> error for rows that could not be sampled (their token is meaningless)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor | None = None
    failed: dict[int, Exception] = field(default_factory=dict)


def _changed(logits: torch.Tensor, rows: Sequence[RowSampler], failed: dict[int, Exception]) -> torch.Tensor:
    """Each row's changes applied (a copy); a row whose changes raise, or leave no finite logit, fails alone and
    keeps its logits as they were (the batch samples on, its token is dropped)."""
    if not any(r.changes_logits for r in rows):
        return logits
    out = logits.clone()
    for row, r in enumerate(rows):
        if not r.changes_logits:
            continue
        try:
            r.adjust(out[row])
        except Exception as exc:  # this row's mask (or bias) broke: fail it alone
            failed[row] = exc
        else:
            if not bool(torch.isfinite(out[row]).any()):
                failed[row] = RowError("no token is allowed after this row's logit_bias and constraints")
        if row in failed:
            out[row] = logits[row]
    return out


def _tempered(logits: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    """(B, V) logits / (B,) temperatures, each row shifted by its largest finite logit first (softmax does not
    change). Unshifted, a small positive temperature (1e-40 is a valid one) overflows fp32 to inf, softmax makes
    NaN of it and the inverse CDF returns index V, a token outside the vocabulary; shifted, every logit is <= 0
    and the row becomes the argmax (ties shared). The floor keeps a temperature that fp32 rounds to 0 from 0/0."""
    top = logits.amax(-1, keepdim=True)  # (B, 1)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return (logits - top) / temps.clamp(min=torch.finfo(logits.dtype).tiny)[:, None]


def sample(logits: torch.Tensor, rows: Sequence[RowSampler], *, vocab_limit: int | None = None,
           uniforms: torch.Tensor | None = None, with_logprobs: bool = False) -> Picked:
    """One token per row of (B, V) logits by each row's params (module docstring). ``uniforms`` (B,) replaces the
    rows' own generators (a caller drawing from one shared generator)."""
    logits = logits.float()
    if vocab_limit is not None and vocab_limit < logits.shape[-1]:
        logits = logits.clone()
        logits[:, vocab_limit:] = float("-inf")
    failed: dict[int, Exception] = {}
    logits = _changed(logits, rows, failed)
    params = [r.params for r in rows]
    tokens = logits.argmax(-1)  # (B,)
    sampled = [row for row, p in enumerate(params) if not p.greedy]
    if not sampled:
        logp = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1) if with_logprobs else None
        return Picked(tokens, logp, failed)
    device = logits.device
    temps = torch.tensor([p.temperature or 1.0 for p in params]).to(device, non_blocking=True)  # greedy: untouched
    filtered = filter_logits(_tempered(logits, temps),  # the filters' numbers stay on the host (filter_logits)
                             torch.tensor([0 if p.greedy else p.top_k for p in params]),
                             torch.tensor([1.0 if p.greedy else p.top_p for p in params]),
                             torch.tensor([0.0 if p.greedy else p.min_p for p in params]))
    if uniforms is None:
        uniforms = torch.cat([rows[row].uniform() for row in sampled])  # (S,)
    else:
        uniforms = uniforms[sampled]
    probs = torch.softmax(filtered[sampled], dim=-1)  # (S, V)
    tokens[sampled] = inverse_cdf(probs, uniforms.to(device))
    logp = None
    if with_logprobs:
        logp = torch.log_softmax(filtered, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    return Picked(tokens, logp, failed)


def check_offline(params: SamplingParams, caller: str) -> None:
    """``generate()`` and ``rollout()`` return token ids: refuse the fields only the server honours."""
    if params.stop:
        raise SamplingError("stop", f"{caller} ends at stop_ids; stop strings need decoded text (the server)")
    if params.n != 1:
        raise SamplingError("n", f"{caller} makes one sequence a prompt; repeat the prompt for more")
    if params.echo or params.logprobs is not None:
        raise SamplingError("echo" if params.echo else "logprobs", f"{caller} returns token ids only")


def legacy_params(max_new_tokens: int | None, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  greedy: bool = False, eos_ids: int | Iterable[int] | None = None,
                  seed: int | None = 0) -> SamplingParams:
    """SamplingParams from ``generate()``'s keyword arguments (``greedy`` is temperature 0; a sampled call needs a
    temperature > 0, as ``meshlm generate --temperature`` always did)."""
    if max_new_tokens is not None and max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not greedy and not temperature > 0:
        raise SamplingError("temperature", f"must be > 0 when sampling, got {temperature}; use greedy decoding "
                                           "for temperature 0")
    stop = (eos_ids,) if isinstance(eos_ids, int) else tuple(eos_ids or ())
    return SamplingParams(max_tokens=max_new_tokens, temperature=0.0 if greedy else temperature, top_k=top_k,
                          top_p=top_p, seed=seed, stop_ids=stop)


def _check_prompt(model: Transformer, prompt_ids: list[int]) -> None:
    cfg = model.cfg
    if len(prompt_ids) == 0:
        raise ConfigError("the prompt is empty: give at least one token id")
    if len(prompt_ids) > cfg.max_seq_len:
        raise ConfigError(f"the prompt has {len(prompt_ids)} tokens, more than model.max_seq_len = "
                          f"{cfg.max_seq_len}; shorten it")
    bad = [t for t in prompt_ids if not 0 <= t < cfg.vocab_size]
    if bad:
        raise ConfigError(f"prompt token id {bad[0]} is outside the vocabulary [0, {cfg.vocab_size})")


_LEGACY = ("temperature", "top_k", "top_p", "greedy", "eos_id", "seed")


def generate(model: Transformer, prompt_ids: list[int], max_new_tokens: int | None = None, *,
             params: SamplingParams | None = None, device: torch.device | str = "cpu",
             vocab_limit: int | None = None, fast: bool = True, weights: str = "fp32", speculative: str | None = None,
             **legacy) -> list[int]:
    """Continue prompt_ids and return only the new ids, sampled by ``params`` (or by the keyword arguments
    temperature, top_k, top_p, greedy, eos_id (one id or several: ``stop_ids``) and seed (default 0)).

    Stops after ``max_new_tokens`` (else ``params.max_tokens``), after emitting one of the stop ids (included),
    or when prompt + output reaches model.max_seq_len. ``vocab_limit`` excludes embedding rows beyond the
    tokenizer (padded vocabularies). The model must already be on `device`. The row's generator is its own, seeded
    by the seed (``params.seed`` None: a fresh random one), so a seeded call gives the same ids every time and the
    global RNG is untouched. ``fast=False`` runs the model's plain forward instead of the fast decode path
    (meshlm/generate/decode.py; the same ids, tested); ``weights`` "int8" decodes on int8 copies of the weights
    (meshlm/generate/int8.py: faster on CPU, not the same logits).
    ``speculative="ngram"`` (fp32; no logit bias or penalties) drafts tokens from the prompt and output and verifies
    them in one forward (meshlm/generate/speculative.py: the same ids, greedy or seeded, tested).
    """
    unknown = set(legacy) - set(_LEGACY)
    if unknown:
        raise TypeError(f"generate() got unexpected keyword arguments {sorted(unknown)}")
    if params is not None and legacy:
        raise ConfigError(f"generate(): give either params or {sorted(legacy)}, not both")
    if params is None:
        params = legacy_params(max_new_tokens, eos_ids=legacy.pop("eos_id", None), **legacy)
    check_offline(params, "generate()")
    if speculative is not None:
        from meshlm.generate.speculative import check_speculative

        check_speculative(speculative, params, weights)
    _check_prompt(model, prompt_ids)
    limit = max_new_tokens if max_new_tokens is not None else params.max_tokens
    max_len = min(model.cfg.max_seq_len, len(prompt_ids) + (limit if limit is not None else model.cfg.max_seq_len))
    num_new = max_len - len(prompt_ids)
    if num_new <= 0:
        return []
    if not fast and weights != "fp32":
        raise ConfigError(f"weights {weights!r} decode on the fast path; fast=False runs the model's own fp32 forward")
    net = fast_forward(model, weights) if fast else model
    row = RowSampler(params, model.cfg.vocab_size, device)
    if speculative is not None:
        from meshlm.generate.speculative import speculative_decode

        with torch.inference_mode():
            return speculative_decode(net, model.new_cache(1, max_len, device=device), prompt_ids, num_new,
                                      set(params.stop_ids), row, device=device, vocab_limit=vocab_limit)
    stop, out = set(params.stop_ids), []
    with torch.inference_mode():
        cache = model.new_cache(1, max_len, device=device)
        tokens = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # (1, T_prompt)
        logits = net(tokens, cache=cache, start_pos=0)  # (1, T_prompt | 1, V): prefill
        pos = len(prompt_ids)
        while True:
            picked = sample(logits[:, -1], [row], vocab_limit=vocab_limit)
            if picked.failed:
                raise ConfigError(f"generate(): {picked.failed[0]}")
            token = int(picked.tokens[0])
            row.observe(token)
            out.append(token)
            if token in stop or len(out) == num_new:
                return out
            step = torch.tensor([[token]], dtype=torch.long, device=device)  # (1, 1)
            logits = net(step, cache=cache, start_pos=pos)  # (1, 1, V): decode
            pos += 1
