"""Prompt-lookup speculative decoding: ``generate(..., speculative="ngram")``, ``meshlm generate --speculative
ngram``, ``meshlm bench generate --speculative ngram``, ``meshlm serve --speculative ngram``.

An answer often repeats its prompt (a rewrite, a summary quoting its source, code edited in place, a chat
history). So before each step, :func:`ngram_draft` looks for the last few tokens generated earlier in the prompt
or the output and, when found, drafts the tokens that followed them there — no second model. One forward of the
last token plus the k drafted ones (:class:`~meshlm.generate.decode.FastForward` with ``all_positions``) gives the
logits after each of them, and :func:`verified` picks the row's own token at each position in turn — the argmax
for a greedy row; for a sampled row the token its sampler draws, one uniform of its generator per token as in a
plain step — keeping the draft up to its first token that differs from the pick, and that pick (or, with every
drafted token kept, the one after them). Every token emitted is thus the token the plain loop would have picked
after the same tokens, with the same draws: greedy output is the plain greedy output, and a seeded sampled one is
the plain seeded one (tests/test_speculative.py, on llama and gemma3 models), up to rounding — a forward of k + 1
rows sums its products in another order than k single-row steps, which can flip an exact tie (or a draw that
falls on a boundary of the cumulative distribution).

Because the draft is deterministic, drawing the row's token and comparing it with the draft is the whole
rejection-sampling rule of speculative decoding: a drafted token is kept with its probability under the row's
distribution, and a rejected position emits a token drawn from that distribution without the drafted one. A
sampled row keeps fewer drafts than a greedy one (the higher the temperature, the fewer).

A draft is at most :class:`DraftBudget` tokens long: 8 at first, one fewer after each draft cut short and two more
after one kept whole, so a reply whose chance matches are rejected verifies one drafted token a step, not eight,
and a reply that copies grows back to 8.

The KV cache needs no rollback: slots written for rejected drafts lie beyond the accepted positions and are
overwritten by the next forward, which only ever reads positions before its own.

Where it loses: a forward of k + 1 rows costs more than one row (more so on weights the decode pack would have
multiplied faster: with ``--weights int8``/``int4`` a verification multiplies the fp32 prefill pack, so
speculative decoding is fp32 only), so a draft that is rejected at its first token costs time. An answer that
repeats nothing gets no drafts — only the look-up, a few microseconds a step — but an answer with chance n-gram
matches (random ids, free text) pays for rejected drafts; docs/benchmarks.md "Speculative decoding" has both.
Rows whose logits change with what they emitted (penalties) or that carry a logit bias or a grammar are not
speculated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from meshlm.errors import ConfigError
from meshlm.generate.decode import FastForward
from meshlm.generate.params import SamplingParams
from meshlm.generate.sampling import RowSampler, sample

SPECULATIVE_MODES = ("ngram",)
MAX_DRAFT = 8  # tokens drafted per step at most
MAX_NGRAM, MIN_NGRAM = 3, 2  # the suffix looked up: the longest match first; single tokens match too often


@dataclass
class DraftBudget:
    """How many tokens the next draft may have: two more after a draft kept whole, one fewer after one cut short
    (between 1 and ``limit``; the schedule of transformers' assisted generation). A rejected draft costs its
    rows in the verifying forward (a 9-row forward ~2 one-row steps on SmolLM2), so free text, whose chance n-gram
    matches are mostly rejected, drafts one token at a time, and a copying reply grows back to the full draft."""

    limit: int = MAX_DRAFT
    size: int = 0  # 0: start at the limit

    def __post_init__(self) -> None:
        self.size = self.size or self.limit

    def update(self, drafted: int, kept: int) -> None:
        if drafted:
            self.size = min(self.limit, self.size + 2) if kept == drafted else max(1, self.size - 1)


@dataclass
class SpeculativeStats:
    forwards: int = 0  # model forwards after the prefill
    drafted: int = 0  # tokens proposed
    accepted: int = 0  # of them, emitted (equal to the row's pick)


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
    if params.logit_bias or params.presence_penalty or params.frequency_penalty:
        raise ConfigError("speculative decoding verifies the model's own choices: drop logit_bias and the penalties, "
                          "or drop --speculative")
    if weights != "fp32":
        raise ConfigError(f"speculative decoding runs fp32 weights (its verification multiplies the fp32 pack); "
                          f"--weights {weights}: drop one of them")


def verified(logits: torch.Tensor, draft: list[int], row: RowSampler, vocab_limit: int | None) -> list[int]:
    """(1 + k, V) logits after the last token and each of the k ``draft`` tokens -> the tokens to emit: ``row``'s pick
    at each position in turn (one draw of its generator per pick, as a plain step), the draft kept while it equals
    the pick, ending with the first pick that differs (or the one after the whole draft)."""
    out: list[int] = []
    for i in range(len(draft) + 1):
        picked = sample(logits[i:i + 1], [row], vocab_limit=vocab_limit)
        if picked.failed:
            raise ConfigError(f"speculative decoding: {picked.failed[0]}")
        out.append(int(picked.tokens[0]))
        if i == len(draft) or out[-1] != draft[i]:
            return out
    return out


def _forward_all(net, tokens: list[int], cache, start_pos: int, device) -> torch.Tensor:
    """The logits (T, V) after each of ``tokens`` fed at ``start_pos``, on the fast path or the plain forward."""
    ids = torch.tensor([tokens], dtype=torch.long, device=device)  # (1, T)
    if isinstance(net, FastForward):
        return net(ids, cache=cache, start_pos=start_pos, all_positions=True)[0]
    return net(ids, cache=cache, start_pos=start_pos)[0]


def speculative_decode(net, cache, prompt_ids: list[int], num_new: int, stop_ids: set[int], row: RowSampler, *,
                       device: torch.device | str = "cpu", vocab_limit: int | None = None,
                       max_draft: int = MAX_DRAFT, stats: SpeculativeStats | None = None) -> list[int]:
    """``row``'s continuation of ``prompt_ids`` (at most ``num_new`` tokens, ending after a stop id) with
    prompt-lookup drafts (module docstring). ``net`` is a FastForward or a plain decoder; ``cache`` is empty and
    holds len(prompt_ids) + num_new positions; ``row`` must not change logits (no bias, penalties or mask)."""
    if row.changes_logits:  # its logits would change with each emitted token: verified() picks from fixed ones
        raise ConfigError("speculative decoding verifies the model's own choices: drop logit_bias, the penalties and "
                          "constraints, or drop speculative")
    stats = stats if stats is not None else SpeculativeStats()
    budget = DraftBudget(max_draft)
    out = verified(_forward_all(net, prompt_ids, cache, 0, device)[-1:], [], row, vocab_limit)
    pos = len(prompt_ids)  # the cache slot of out[-1], not yet fed
    while out[-1] not in stop_ids and len(out) < num_new:
        draft = ngram_draft(prompt_ids + out, min(budget.size, num_new - len(out) - 1))
        picks = verified(_forward_all(net, [out[-1], *draft], cache, pos, device), draft, row, vocab_limit)
        budget.update(len(draft), len(picks) - 1)
        stats.forwards += 1
        stats.drafted += len(draft)
        for i, token in enumerate(picks):
            out.append(token)
            pos += 1
            stats.accepted += i < len(picks) - 1  # an emitted draft token (the last pick is the row's own)
            if token in stop_ids or len(out) == num_new:
                break
    return out
