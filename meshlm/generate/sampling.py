"""Autoregressive sampling with the KV cache: prefill the prompt once, then decode one token per step."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from meshlm.errors import ConfigError
from meshlm.generate.decode import fast_forward
from meshlm.models.llama import Transformer


def _check_filters(top_k: int, top_p: float) -> None:
    if isinstance(top_k, bool) or int(top_k) != top_k or top_k < 0:
        raise ConfigError(f"top_k must be an integer >= 0 (0 disables it), got {top_k!r}")
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1] (1 disables it), got {top_p!r}")


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the nucleus (top-p); logits (..., V).

    top_k keeps the k largest (ties with the k-th are kept). top_p keeps the smallest set of most likely
    tokens whose probability reaches top_p: a token is dropped when the tokens ranked above it already hold
    at least top_p of the mass, so the most likely token always survives. A new tensor is returned.
    """
    _check_filters(top_k, top_p)
    logits = logits.clone()
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits[logits < kth] = float("-inf")
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V)
        probs = torch.softmax(sorted_logits.float(), dim=-1)
        mass_above = probs.cumsum(dim=-1) - probs  # (..., V) mass of the tokens ranked strictly higher
        drop_sorted = mass_above >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits[drop] = float("-inf")
    return logits


def _check_request(model: Transformer, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                   greedy: bool, top_k: int, top_p: float) -> None:
    cfg = model.cfg
    if len(prompt_ids) == 0:
        raise ConfigError("the prompt is empty: give at least one token id")
    if len(prompt_ids) > cfg.max_seq_len:
        raise ConfigError(f"the prompt has {len(prompt_ids)} tokens, more than model.max_seq_len = "
                          f"{cfg.max_seq_len}; shorten it")
    bad = [t for t in prompt_ids if not 0 <= t < cfg.vocab_size]
    if bad:
        raise ConfigError(f"prompt token id {bad[0]} is outside the vocabulary [0, {cfg.vocab_size})")
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not greedy and not temperature > 0:
        raise ConfigError(f"temperature must be > 0 when sampling, got {temperature}; use greedy decoding "
                          "for temperature 0")
    _check_filters(top_k, top_p)


def _next_token(logits: torch.Tensor, *, greedy: bool, temperature: float, top_k: int, top_p: float,
                generator: torch.Generator) -> int:
    """One id from the last position's logits (V,)."""
    if greedy:
        return int(torch.argmax(logits))
    filtered = filter_logits(logits.float() / temperature, top_k, top_p)
    probs = torch.softmax(filtered, dim=-1)
    return int(torch.multinomial(probs, num_samples=1, generator=generator))


def generate(model: Transformer, prompt_ids: list[int], max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
             eos_id: int | Iterable[int] | None = None, seed: int = 0, device: torch.device | str = "cpu",
             vocab_limit: int | None = None, fast: bool = True, weights: str = "fp32") -> list[int]:
    """Continue prompt_ids and return only the new ids.

    Stops after max_new_tokens, after emitting eos_id (or any of several eos ids; included), or when prompt +
    output reaches model.max_seq_len. ``vocab_limit`` excludes embedding rows beyond the tokenizer (padded
    vocabularies) from sampling. The model must already be on `device`. Sampling uses a local generator seeded with
    `seed`, so the same call gives the same ids and the global RNG is untouched. ``fast=False`` runs the model's
    plain forward instead of the fast decode path (meshlm/generate/decode.py; the same ids, tested); ``weights``
    "int8" decodes on int8 copies of the weights (meshlm/generate/int8.py: faster on CPU, not the same logits).
    """
    _check_request(model, prompt_ids, max_new_tokens, temperature, greedy, top_k, top_p)
    max_len = min(model.cfg.max_seq_len, len(prompt_ids) + max_new_tokens)
    num_new = max_len - len(prompt_ids)
    if num_new <= 0:
        return []
    generator = torch.Generator(device=device).manual_seed(seed)
    sample = dict(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    stop = {eos_id} if isinstance(eos_id, int) else set(eos_id or ())
    out: list[int] = []
    if not fast and weights != "fp32":
        raise ConfigError(f"weights {weights!r} decode on the fast path; fast=False runs the model's own fp32 forward")
    net = fast_forward(model, weights) if fast else model
    with torch.inference_mode():
        cache = model.new_cache(1, max_len, device=device)
        tokens = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # (1, T_prompt)
        logits = net(tokens, cache=cache, start_pos=0)  # (1, T_prompt | 1, V): prefill
        pos = len(prompt_ids)
        while True:
            last = logits[0, -1]  # (V,)
            if vocab_limit is not None and vocab_limit < last.shape[-1]:
                last = last.clone()
                last[vocab_limit:] = float("-inf")
            token = _next_token(last, **sample)
            out.append(token)
            if token in stop or len(out) == num_new:
                return out
            step = torch.tensor([[token]], dtype=torch.long, device=device)  # (1, 1)
            logits = net(step, cache=cache, start_pos=pos)  # (1, 1, V): decode
            pos += 1
