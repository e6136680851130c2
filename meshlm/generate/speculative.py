"""Prompt-lookup speculative decoding for greedy generation: ``generate(..., speculative="ngram")``,
``meshlm generate --speculative ngram``, ``meshlm bench generate --speculative ngram``.

An answer often repeats its prompt (a rewrite, a summary quoting its source, code edited in place, a chat
history). So before each step, :func:`ngram_draft` looks for the last few tokens generated earlier in the prompt
or the output and, when found, drafts the tokens that followed them there — no second model. One forward of the
last token plus the k drafted ones (:class:`~meshlm.generate.decode.FastForward` with ``all_positions``) gives the
greedy token after each of them; the draft is accepted up to its first token that differs from the model's own
choice, and that choice (or, with every drafted token accepted, the one after them) is taken too. Every token
emitted is thus the argmax the plain loop would have taken after the same tokens: the output is the plain greedy
output (tests/test_speculative.py, on llama and gemma3 models), up to rounding — a forward of k + 1 rows sums its
products in another order than k single-row steps, which can flip an exact tie.

The KV cache needs no rollback: slots written for rejected drafts lie beyond the accepted positions and are
overwritten by the next forward, which only ever reads positions before its own.

Where it loses: a forward of k + 1 rows costs more than one row (more so on weights the decode pack would have
multiplied faster: with ``--weights int8``/``int4`` a verification multiplies the fp32 prefill pack, so
speculative decoding is fp32 only), so a draft that is rejected at its first token costs time. An answer that
repeats nothing gets no drafts — only the look-up, a few microseconds a step — but an answer with chance n-gram
matches (random ids, free text) pays for rejected drafts; docs/benchmarks.md "Speculative decoding" has both.
Greedy only: sampling would need the rejection-sampling correction, not implemented.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from meshlm.errors import ConfigError
from meshlm.generate.decode import FastForward
from meshlm.generate.params import SamplingParams

SPECULATIVE_MODES = ("ngram",)
MAX_DRAFT = 8  # tokens drafted per step at most
MAX_NGRAM, MIN_NGRAM = 3, 2  # the suffix looked up: the longest match first; single tokens match too often


@dataclass
class SpeculativeStats:
    forwards: int = 0  # model forwards after the prefill
    drafted: int = 0  # tokens proposed
    accepted: int = 0  # of them, equal to the model's greedy choice


def ngram_draft(ids: list[int], max_draft: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM
                ) -> list[int]:
    """Up to ``max_draft`` tokens that followed the latest earlier occurrence of ``ids``' last n tokens (n from
    ``max_ngram`` down to ``min_ngram``); [] when none occurs."""
    if max_draft <= 0:
        return []
    for n in range(min(max_ngram, len(ids) - 1), min_ngram - 1, -1):
        suffix = ids[-n:]
        for start in range(len(ids) - n - 1, -1, -1):  # latest first; the suffix itself excluded
            if ids[start:start + n] == suffix:
                return ids[start + n:start + n + max_draft]
    return []


def check_speculative(mode: str | None, params: SamplingParams, weights: str) -> None:
    """Refuse what speculative decoding cannot do exactly (a ConfigError naming the argument)."""
    if mode is None:
        return
    if mode not in SPECULATIVE_MODES:
        raise ConfigError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)} (or off), got {mode!r}")
    if not params.greedy:
        raise ConfigError("speculative decoding is greedy only: use temperature 0 (--greedy), or drop --speculative")
    if params.logit_bias or params.presence_penalty or params.frequency_penalty:
        raise ConfigError("speculative decoding verifies plain greedy choices: drop logit_bias and the penalties, "
                          "or drop --speculative")
    if weights != "fp32":
        raise ConfigError(f"speculative decoding runs fp32 weights (its verification multiplies the fp32 pack); "
                          f"--weights {weights}: drop one of them")


def greedy_tokens(logits: torch.Tensor, vocab_limit: int | None) -> list[int]:
    """(T, V) logits -> each position's argmax, as sampling.sample picks a greedy token."""
    logits = logits.float()
    if vocab_limit is not None and vocab_limit < logits.shape[-1]:
        logits = logits[:, :vocab_limit]  # the ids beyond are -inf to sample(): never chosen
    return logits.argmax(-1).tolist()


def _forward_all(net, tokens: list[int], cache, start_pos: int, device) -> torch.Tensor:
    """The logits (T, V) after each of ``tokens`` fed at ``start_pos``, on the fast path or the plain forward."""
    ids = torch.tensor([tokens], dtype=torch.long, device=device)  # (1, T)
    if isinstance(net, FastForward):
        return net(ids, cache=cache, start_pos=start_pos, all_positions=True)[0]
    return net(ids, cache=cache, start_pos=start_pos)[0]


def speculative_greedy(net, cache, prompt_ids: list[int], num_new: int, stop_ids: set[int], *,
                       device: torch.device | str = "cpu", vocab_limit: int | None = None,
                       max_draft: int = MAX_DRAFT, stats: SpeculativeStats | None = None) -> list[int]:
    """Greedy continuation of ``prompt_ids`` (at most ``num_new`` tokens, ending after a stop id) with prompt-lookup
    drafts (module docstring). ``net`` is a FastForward or a plain decoder; ``cache`` is empty and holds
    len(prompt_ids) + num_new positions."""
    stats = stats if stats is not None else SpeculativeStats()
    out = [greedy_tokens(_forward_all(net, prompt_ids, cache, 0, device)[-1:], vocab_limit)[0]]
    pos = len(prompt_ids)  # the cache slot of out[-1], not yet fed
    while out[-1] not in stop_ids and len(out) < num_new:
        draft = ngram_draft(prompt_ids + out, min(max_draft, num_new - len(out) - 1))
        chosen = greedy_tokens(_forward_all(net, [out[-1], *draft], cache, pos, device), vocab_limit)  # (1 + k,)
        stats.forwards += 1
        stats.drafted += len(draft)
        for i, token in enumerate(chosen):
            out.append(token)
            pos += 1
            if token in stop_ids or len(out) == num_new or i == len(draft) or token != draft[i]:
                break
            stats.accepted += 1
    return out
