"""Frozen copies of a model laid out like the policy (a DPO reference, a PPO reward model) for post-training.

Order, as for the policy: meta model → ``objective.adapt_model`` (e.g. a score head) → LoRA (freezes the base)
→ the engine's parallelism → materialisation (adapters drawn from (seed, name)) → weights. The model is built as every run builds it (meshlm/models/build.py); the
weights load as a checkpoint's do (meshlm/checkpoint/load.py). A LoRA run's checkpoints hold only the adapters
(and their optimizer state); its base is ``checkpoint.init_from``, loaded on every start, resumed or not, and
recorded in train_state.json as ``lora_base``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from torch import nn

from meshlm.checkpoint.load import load_checkpoint_weights, resolve_checkpoint, source_config
from meshlm.config.schema import JobConfig
from meshlm.errors import ConfigError
from meshlm.models.build import adapt_meta_model, meta_model
from meshlm.objectives import build_objective


def freeze(parts: list[nn.Module]) -> list[nn.Module]:
    for part in parts:
        part.requires_grad_(False)
        part.eval()
    return parts


def build_frozen(policy_cfg: JobConfig, engine, policy_objective, checkpoint: str | None = None,
                 adapt: Callable[[nn.Module], None] | None = None) -> list[nn.Module]:
    """A frozen model laid out like the policy (see ObjectiveContext). ``checkpoint=None``: the policy's
    starting weights without LoRA (its ``checkpoint.init_from``, else the seeded initialisation)."""
    if checkpoint is None:
        cfg, objective = dataclasses.replace(policy_cfg, lora=dataclasses.replace(policy_cfg.lora, rank=0)), \
            policy_objective
        path = resolve_checkpoint(cfg.checkpoint.init_from) if cfg.checkpoint.init_from else None
    else:
        path, cfg = source_config(checkpoint)
        objective = build_objective(cfg.training.objective, cfg.objective)
    if engine.pipelined:
        raise ConfigError("frozen reference/reward models are not supported with pipeline parallelism; use "
                          "parallel.pp = 1")
    model = meta_model(cfg.model)
    adapt_meta_model(model, objective, cfg.lora)
    if adapt is not None:
        adapt(model)
    # No activation checkpointing or compile: the copy only runs forward under no_grad.
    training = dataclasses.replace(policy_cfg.training, activation_checkpointing="none", compile=False)
    parts = engine.parallelize(model, training, None, 1, frozen=True)
    if path is not None:
        load_checkpoint_weights(path, cfg, parts)
    return freeze(parts)
