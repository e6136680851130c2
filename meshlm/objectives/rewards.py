"""Rewards for the generating objectives (PPO, GRPO): a Python function named in the config, or a reward model.

A reward function is named ``"module:function"`` (``objective.reward_fn``) and called once per rollout with
three lists of the same length: the prompts and the responses as text (special tokens dropped, the response
without its eos) and each prompt row's other JSONL fields (``extra``). It returns one float per response.
Functions shipped here, for the demo configs:

- ``meshlm.objectives.rewards:contains_number`` — 1 if the response contains a digit, else 0 ("answer with a
  number").
- ``meshlm.objectives.rewards:matches_answer`` — 1 if the row's ``answer`` field occurs in the response.

A reward model is a ``reward`` run's checkpoint (``objective.reward_model``): its ``output`` is a 1-output score
head and a sequence's score is its value at the last real token (the response's eos, or its last token when cut
at max_new_tokens).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from meshlm.errors import ConfigError

RewardFn = Callable[[list[str], list[str], list[dict[str, Any]]], Sequence[float]]


def contains_number(prompts: list[str], responses: list[str], extras: list[dict[str, Any]]) -> list[float]:
    """1.0 for a response with at least one digit, else 0.0."""
    return [float(any(ch.isdigit() for ch in text)) for text in responses]


def matches_answer(prompts: list[str], responses: list[str], extras: list[dict[str, Any]]) -> list[float]:
    """1.0 when the row's ``answer`` field (as text) occurs in the response, else 0.0."""
    return [float(str(extra.get("answer", "")) != "" and str(extra["answer"]) in text)
            for text, extra in zip(responses, extras)]


def load_reward_fn(spec: str) -> RewardFn:
    """The function ``"module:function"`` names (``objective.reward_fn``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"objective.reward_fn {spec!r} must be 'module:function', e.g. "
                          "'meshlm.objectives.rewards:contains_number'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"objective.reward_fn: cannot import module {module_name!r} ({exc}); make it importable "
                          "(installed, or on PYTHONPATH)") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"objective.reward_fn: module {module_name!r} has no function {attr!r}")
    return fn


def call_reward_fn(fn: RewardFn, spec: str, prompts: list[str], responses: list[str],
                   extras: list[dict[str, Any]], device: torch.device) -> torch.Tensor:
    """(B,) fp32 scores; a wrong count or a non-finite value is the function's error, named as such."""
    scores = fn(prompts, responses, extras)
    try:
        out = torch.tensor([float(s) for s in scores], dtype=torch.float32)
    except (TypeError, ValueError):
        raise ConfigError(f"objective.reward_fn {spec} must return a list of numbers") from None
    if out.shape != (len(responses),) or not bool(torch.isfinite(out).all()):
        raise ConfigError(f"objective.reward_fn {spec} returned {out.numel()} values for {len(responses)} responses "
                          "(or a non-finite value); return one finite number per response")
    return out.to(device)


@torch.no_grad()
def reward_model_scores(model: nn.Module, ids: torch.Tensor, padding_mask: torch.Tensor,
                        positions: torch.Tensor) -> torch.Tensor:
    """(B,) fp32 scores of left-padded sequences (B, L) at each row's last real token.

    ``padding_mask`` is True on real tokens; the last real token is the last True slot of each row.
    """
    values = model(ids, position_ids=positions, padding_mask=padding_mask).squeeze(-1).float()  # (B, L)
    slots = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)  # (B, L)
    last = torch.where(padding_mask, slots, -1).max(dim=1).values  # (B,) last real slot
    return values.gather(1, last[:, None]).squeeze(1)
