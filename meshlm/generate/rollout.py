"""Batched generation for rollouts (PPO, GRPO): many prompts of different lengths decoded together, one KV cache.

Layout: the prompts are left-padded to the longest, P slots. Slot j of row b holds a real token when j >= pad_b;
real tokens get their own RoPE positions (slot - pad_b) and the model's ``padding_mask`` hides the pads from
attention, so each row's logits are the ones it would get alone (tested against ``generate()`` and the plain
forward, tests/test_decoding_core.py). Every decode step appends one slot to every row; a row that has emitted one
of its ``stop_ids`` gets pad tokens from then on, outside its response mask.

Layout-independent sampling: with ``row_seeds`` each row draws its uniforms from its own generator (seeded by
the caller from the row's global sample index) and samples by inverse CDF (the one sampler,
meshlm/generate/sampling.py), so a row's tokens do not depend on which rank it is on or which rows share its
batch; ``prompt_width`` pads every rank to the same P.

Under data parallelism each rank generates from its own prompts. FSDP all-gathers parameters in every forward, a
collective, so all ranks must run the same number of forwards: ``all_finished`` (a callable that ANDs a flag
over the ranks, e.g. an all-reduce) makes them stop together; the last ranks to finish decide.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from meshlm.errors import ConfigError
from meshlm.generate.decode import fast_forward
from meshlm.generate.params import SamplingError, SamplingParams
from meshlm.generate.sampling import RowSampler, check_offline, row_seed, sample


@dataclass
class Rollout:
    """Prompts and their sampled responses. Slots past a row's eos hold ``pad_id`` and are outside its mask."""

    prompt_ids: torch.Tensor  # (B, P) int64, left-padded
    prompt_mask: torch.Tensor  # (B, P) bool, True on real prompt tokens
    response_ids: torch.Tensor  # (B, N) int64, right-padded
    response_mask: torch.Tensor  # (B, N) bool, True on generated tokens (the eos included)
    logprobs: torch.Tensor  # (B, N) fp32 log-prob of each token under the sampling distribution, 0 off the mask

    @property
    def num_tokens(self) -> int:
        """Generated tokens (eos included)."""
        return int(self.response_mask.sum())

    def sequences(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Inputs for one full forward over prompt + response: ids, padding mask and position ids, each
        (B, P + N). Position ids count real tokens only, so they equal the ones used while decoding."""
        ids = torch.cat([self.prompt_ids, self.response_ids], dim=1)  # (B, P + N)
        mask = torch.cat([self.prompt_mask, self.response_mask], dim=1)  # (B, P + N)
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)  # pads before the prompt sit at 0
        return ids, mask, positions


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device | str,
             width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) ids right-aligned with pad_id in front, and the (B, P) bool mask of real tokens; P = ``width``
    (at least the longest prompt) or the longest prompt."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt needs at least one token")
    longest = max(len(p) for p in prompts)
    if width is not None and width < longest:
        raise ConfigError(f"prompt_width {width} is shorter than the longest prompt ({longest} tokens)")
    width = width or longest
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.as_tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt):] = True
    return ids.to(device), mask.to(device)


# Decode steps between checks that every row has ended: each check waits for the device (a host sync), free on
# CPU. Steps past the end only decode pads; the responses are cut back to where the last row ended.
STOP_CHECK_EVERY = {"cuda": 8}


def unwrap(model: nn.Module) -> nn.Module:
    """The module to call for generation: DDP's wrapper only adds gradient bookkeeping (FSDP2 modules are called
    as they are: their hooks gather the parameters)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def _row_samplers(params: SamplingParams, count: int, vocab_size: int, device: torch.device | str,
                  row_seeds: Sequence[int] | None, shared: bool) -> list[RowSampler]:
    """One sampler a row: seeded by ``row_seeds[b]``, else by ``params.seed`` (row b: :func:`row_seed`), else
    drawing from the caller's generator (``shared``)."""
    if row_seeds is not None and len(row_seeds) != count:
        raise ConfigError(f"{len(row_seeds)} row seeds for {count} prompts")
    seeds = list(row_seeds) if row_seeds is not None else [row_seed(params.seed, b) for b in range(count)]
    return [RowSampler(params, vocab_size, device, seed=seeds[b], own_generator=not shared) for b in range(count)]


def _check(params: SamplingParams, longest: int, net: nn.Module, fast: bool, weights: str) -> int:
    """The steps to decode (params.max_tokens), refused where the model cannot hold them."""
    check_offline(params, "rollout()")
    steps = params.max_tokens
    if steps is None or steps < 1:
        raise SamplingError("max_tokens", f"a rollout needs max_tokens >= 1, got {steps}")
    if not fast and weights != "fp32":
        raise ConfigError(f"weights {weights!r} decode on the fast path; fast=False runs the model's own fp32 forward")
    if longest + steps > net.cfg.max_seq_len:
        raise ConfigError(f"prompts of up to {longest} tokens + max_tokens {steps} exceed "
                          f"model.max_seq_len = {net.cfg.max_seq_len}; shorten the prompts or lower max_tokens")
    return steps


@torch.no_grad()  # not inference_mode: FSDP reuses the gathered parameters' storage in later training forwards
def rollout(model: nn.Module, prompts: Sequence[Sequence[int]], params: SamplingParams, *, pad_id: int = 0,
            vocab_limit: int | None = None, generator: torch.Generator | None = None,
            device: torch.device | str = "cpu", all_finished: Callable[[bool], bool] | None = None,
            row_seeds: Sequence[int] | None = None, prompt_width: int | None = None, fast: bool = True,
            weights: str = "fp32", copies: bool = True) -> Rollout:
    """Generate a response for every prompt, all rows decoded together with one KV cache, each row sampled by
    ``params`` with the one sampler (meshlm/generate/sampling.py).

    Stops when every row has emitted one of ``params.stop_ids`` (on every rank, with ``all_finished``) or after
    ``params.max_tokens``; N, the number of tokens up to where the last row ended (with ``all_finished``: the
    steps taken, the same on every rank), is the responses' width. Each row draws from its own generator, seeded
    by ``row_seeds[b]`` or by ``params.seed`` (row 0 with the seed itself: one row samples as ``generate()`` does
    with that seed); with neither, the rows draw from ``generator`` (or torch's global one). ``prompt_width``
    fixes P (module docstring); ``pad_id`` fills the slots past a row's end; ``vocab_limit`` excludes embedding
    rows beyond the tokenizer. ``fast=False`` runs the model's plain forward instead of the fast decode path
    (meshlm/generate/decode.py); ``weights="int8"`` decodes on int8 copies of the weights (meshlm/generate/int8.py;
    not for training rollouts, whose log-probabilities must be the policy's own). ``copies=False`` multiplies the
    model's own weights as its plain forward does (no column-block copies, meshlm/generate/split.py): what
    training rollouts use, so that a single device samples the same tokens as a sharded layout's plain forward.
    """
    net = unwrap(model)
    prompt_ids, prompt_mask = left_pad(prompts, pad_id, device, prompt_width)
    B, P = prompt_ids.shape
    steps = _check(params, P, net, fast, weights)
    forward = fast_forward(net, weights, copies) if fast else net
    shared = row_seeds is None and params.seed is None
    if generator is not None and not shared:
        raise ConfigError("rollout(): the rows are seeded (row_seeds or params.seed); drop the generator, or the seeds")
    rows = _row_samplers(params, B, net.cfg.vocab_size, device, row_seeds, shared)
    eos = torch.tensor(sorted(set(params.stop_ids)), dtype=torch.long, device=device)
    cache = net.new_cache(B, P + steps, device=device)
    # No row padded (one prompt, or prompts of one length): positions follow the slots, no mask is needed.
    dense = bool(prompt_mask.all())
    mask = torch.cat([prompt_mask, torch.ones(B, steps, dtype=torch.bool, device=device)], 1)
    next_pos = prompt_mask.long().sum(1)  # (B,) position of each row's next token
    positions = (prompt_mask.long().cumsum(1) - 1).clamp(min=0)  # (B, P)
    logits = forward(prompt_ids, cache=cache, start_pos=0, position_ids=None if dense else positions,
                     padding_mask=None if dense else mask[:, :P])
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    tokens, logps, alive = [], [], []
    check_every = STOP_CHECK_EVERY.get(torch.device(device).type, 1) if eos.numel() else steps
    for step in range(steps):
        picked = sample(logits[:, -1], rows, vocab_limit=vocab_limit, with_logprobs=True,
                        uniforms=_shared_uniforms(B, generator) if shared and not params.greedy else None)
        if picked.failed:
            raise ConfigError(f"rollout(): row {min(picked.failed)}: {picked.failed[min(picked.failed)]}")
        token, logp = picked.tokens, picked.logprobs  # (B,) each
        if rows[0].counts is not None:  # penalties count each live row's tokens
            for b in (~finished).nonzero().squeeze(1).tolist():
                rows[b].observe(int(token[b]))
        alive.append(~finished)
        tokens.append(torch.where(finished, pad_id, token))
        logps.append(torch.where(finished, 0.0, logp))
        finished = finished | torch.isin(token, eos)
        if (step + 1) % check_every == 0 or step + 1 == steps:
            done = bool(finished.all()) or step + 1 == steps
            if all_finished(done) if all_finished is not None else done:
                break
        slot = P + step
        logits = forward(tokens[-1][:, None], cache=cache, start_pos=slot,
                         position_ids=None if dense else (next_pos + step)[:, None],
                         padding_mask=None if dense else mask[:, :slot + 1])  # (B, 1, V)
    alive_cols = torch.stack(alive, 1)
    width = alive_cols.shape[1] if all_finished is not None else int(alive_cols.any(0).sum())
    return Rollout(prompt_ids, prompt_mask, torch.stack(tokens, 1)[:, :width], alive_cols[:, :width],
                   torch.stack(logps, 1)[:, :width])


def _shared_uniforms(count: int, generator: torch.Generator | None) -> torch.Tensor:
    """(count,) fp64 uniforms from the caller's generator (on its device), or torch's global one."""
    device = generator.device if generator is not None else "cpu"
    return torch.rand(count, generator=generator, dtype=torch.float64, device=device)
