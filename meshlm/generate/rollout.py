"""Batched generation for rollouts (PPO, GRPO): many prompts of different lengths decoded together, one KV cache.

Layout: the prompts are left-padded to the longest, P slots. Slot j of row b holds a real token when j >= pad_b;
real tokens get their own RoPE positions (slot - pad_b) and the model's ``padding_mask`` hides the pads from
attention, so each row's logits are the ones it would get alone (tested against the single-sequence sampler in
sampling.py). Every decode step appends one slot to every row; a row that has emitted one of the eos ids gets
pad tokens from then on, outside its response mask.

Layout-independent sampling: with ``row_seeds`` each row draws its uniforms from its own generator (seeded by
the caller from the row's global sample index) and samples by inverse CDF, so a row's tokens do not depend on
which rank it is on or which rows share its batch; ``prompt_width`` pads every rank to the same P.

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
from meshlm.generate.sampling import filter_logits


@dataclass(frozen=True)
class SamplingConfig:
    """How a rollout samples. ``eos_ids``: a response ends after emitting any of them (e.g. ``<|eos|>`` and the
    chat template's ``<|end|>``). ``vocab_limit`` excludes embedding rows beyond the tokenizer (padded
    vocabularies)."""

    max_new_tokens: int
    eos_ids: tuple[int, ...]
    pad_id: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    vocab_limit: int | None = None

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0 when sampling, got {self.temperature}")
        filter_logits(torch.zeros(1), self.top_k, self.top_p)  # checks top_k / top_p


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


def sample_tokens(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None,
                  uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from (B, V) logits -> (tokens (B,), their log-probs (B,) fp32).

    The log-prob is under the distribution actually sampled from: softmax(filter(logits / temperature)); for
    greedy decoding, softmax(logits). With ``uniforms`` (B,) in [0, 1), row b takes the first token whose
    cumulative probability exceeds ``uniforms[b]`` (inverse CDF): a function of the row alone.
    """
    logits = logits.float()
    if cfg.vocab_limit is not None and cfg.vocab_limit < logits.shape[-1]:
        logits[:, cfg.vocab_limit:] = float("-inf")
    if cfg.greedy:
        tokens = logits.argmax(-1)  # (B,)
        logp = torch.log_softmax(logits, dim=-1)
    else:
        logp = torch.log_softmax(filter_logits(logits / cfg.temperature, cfg.top_k, cfg.top_p), dim=-1)
        if uniforms is None:
            tokens = torch.multinomial(logp.exp(), num_samples=1, generator=generator).squeeze(1)  # (B,)
        else:
            tokens = inverse_cdf(logp.exp(), uniforms)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """(B, V) probabilities, (B,) uniforms in [0, 1) -> (B,) the first index whose cumulative mass exceeds
    u · total, computed in fp64. The target is kept strictly below the total, so a zero-probability token (equal
    cumulative values, e.g. beyond ``vocab_limit``) is never the first to exceed it."""
    cdf = probs.double().cumsum(-1)  # (B, V)
    total = cdf[:, -1:]  # (B, 1)
    target = torch.minimum(uniforms.to(cdf)[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(1)


def row_uniforms(row_seeds: Sequence[int], steps: int, device: torch.device | str) -> torch.Tensor:
    """(B, steps) uniforms, row b from a CPU generator seeded by ``row_seeds[b]`` (the same on every device)."""
    rows = [torch.rand(steps, generator=torch.Generator(device="cpu").manual_seed(int(s)), dtype=torch.float64)
            for s in row_seeds]
    return torch.stack(rows).to(device)


# Decode steps between checks that every row has ended: each check waits for the device (a host sync), free on
# CPU. Steps past the end only decode pads; the responses are cut back to where the last row ended.
STOP_CHECK_EVERY = {"cuda": 8}


def unwrap(model: nn.Module) -> nn.Module:
    """The module to call for generation: DDP's wrapper only adds gradient bookkeeping (FSDP2 modules are called
    as they are: their hooks gather the parameters)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@torch.no_grad()  # not inference_mode: FSDP reuses the gathered parameters' storage in later training forwards
def rollout(model: nn.Module, prompts: Sequence[Sequence[int]], cfg: SamplingConfig, *,
            generator: torch.Generator | None = None, device: torch.device | str = "cpu",
            all_finished: Callable[[bool], bool] | None = None, row_seeds: Sequence[int] | None = None,
            prompt_width: int | None = None, fast: bool = True, weights: str = "fp32") -> Rollout:
    """Generate a response for every prompt, all rows decoded together with one KV cache.

    Stops when every row has emitted an eos (on every rank, with ``all_finished``) or after
    ``cfg.max_new_tokens``; N, the number of tokens up to where the last row ended (with ``all_finished``: the
    steps taken, the same on every rank), is the responses' width. ``row_seeds`` (one per
    prompt) replaces ``generator`` by per-row inverse-CDF sampling; ``prompt_width`` fixes P (module docstring).
    ``fast=False`` runs the model's plain forward instead of the fast decode path (meshlm/generate/decode.py);
    ``weights="int8"`` decodes on int8 copies of the weights (meshlm/generate/int8.py; not for training rollouts,
    whose log-probabilities must be the policy's own).
    """
    cfg.validate()
    net = unwrap(model)
    if not fast and weights != "fp32":
        raise ConfigError(f"weights {weights!r} decode on the fast path; fast=False runs the model's own fp32 forward")
    forward = fast_forward(net, weights) if fast else net
    prompt_ids, prompt_mask = left_pad(prompts, cfg.pad_id, device, prompt_width)
    if row_seeds is not None and len(row_seeds) != len(prompts):
        raise ConfigError(f"{len(row_seeds)} row seeds for {len(prompts)} prompts")
    uniforms = row_uniforms(row_seeds, cfg.max_new_tokens, device) if row_seeds is not None else None
    B, P = prompt_ids.shape
    if P + cfg.max_new_tokens > net.cfg.max_seq_len:
        raise ConfigError(f"prompts of up to {P} tokens + max_new_tokens {cfg.max_new_tokens} exceed "
                          f"model.max_seq_len = {net.cfg.max_seq_len}; shorten the prompts or lower max_new_tokens")
    eos = torch.tensor(sorted(set(cfg.eos_ids)), dtype=torch.long, device=device)
    cache = net.new_cache(B, P + cfg.max_new_tokens, device=device)
    # No row padded (one prompt, or prompts of one length): positions follow the slots, no mask is needed.
    dense = bool(prompt_mask.all())
    mask = torch.cat([prompt_mask, torch.ones(B, cfg.max_new_tokens, dtype=torch.bool, device=device)], 1)
    next_pos = prompt_mask.long().sum(1)  # (B,) position of each row's next token
    positions = (prompt_mask.long().cumsum(1) - 1).clamp(min=0)  # (B, P)
    logits = forward(prompt_ids, cache=cache, start_pos=0, position_ids=None if dense else positions,
                     padding_mask=None if dense else mask[:, :P])
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    tokens, logps, alive = [], [], []
    check_every = STOP_CHECK_EVERY.get(torch.device(device).type, 1) if eos.numel() else cfg.max_new_tokens
    for step in range(cfg.max_new_tokens):
        u = uniforms[:, step] if uniforms is not None else None
        token, logp = sample_tokens(logits[:, -1], cfg, generator, u)  # (B,) each
        alive.append(~finished)
        tokens.append(torch.where(finished, cfg.pad_id, token))
        logps.append(torch.where(finished, 0.0, logp))
        finished = finished | torch.isin(token, eos)
        if (step + 1) % check_every == 0 or step + 1 == cfg.max_new_tokens:
            done = bool(finished.all()) or step + 1 == cfg.max_new_tokens
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
