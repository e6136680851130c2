"""Building post-training models: the objective's adaptation and LoRA on the meta model, the frozen LoRA base,
and frozen copies (a DPO reference, a reward model) laid out like the policy.

Order, as for the policy: meta model → ``objective.adapt_model`` (e.g. a score head) → LoRA (freezes the base)
→ the engine's parallelism → materialisation (adapters drawn from (seed, name)) → weights. A LoRA run's
checkpoints hold only the adapters (and their optimizer state); its base is ``checkpoint.init_from``, loaded on
every start, resumed or not, and recorded in train_state.json as ``lora_base``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from meshlm.checkpoint.load import resolve_checkpoint
from meshlm.checkpoint.manager import load_weights
from meshlm.config.loader import load_config
from meshlm.config.schema import JobConfig
from meshlm.errors import ConfigError
from meshlm.models import meta_model
from meshlm.models.lora import apply_lora

def param_keys(parts: list[nn.Module], trainable: bool) -> set[str]:
    """State-dict keys of the (non-)trainable parameters of ``parts`` (wrapper prefixes removed)."""
    from meshlm.distributed.init import canonical_name

    return {canonical_name(name).removeprefix("module.") for part in parts
            for name, p in part.named_parameters() if p.requires_grad == trainable}


def adapt_meta_model(model: nn.Module, objective, cfg: JobConfig) -> None:
    """The objective's change to the architecture, then LoRA (which freezes everything but the adapters)."""
    objective.adapt_model(model)
    if cfg.lora.enabled:
        apply_lora(model, cfg.lora.targets, cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout)
        # Modules the objective added (a score head) are new: they train beside the adapters.
        for name in objective.new_modules:
            model.get_submodule(name).requires_grad_(True)


def load_lora_base(cfg: JobConfig, parts: list[nn.Module]) -> Path:
    """Load the frozen base weights of a LoRA model from ``checkpoint.init_from``; returns the folder."""
    path = resolve_checkpoint(cfg.checkpoint.init_from)
    frozen = param_keys(parts, trainable=False)
    load_weights(path, parts, keep=frozen.__contains__)
    return path


def source_config(checkpoint: str | Path) -> tuple[Path, JobConfig]:
    path = resolve_checkpoint(checkpoint)
    return path, load_config(path / "config.toml")


def load_checkpoint_weights(path: Path, cfg: JobConfig, parts: list[nn.Module]) -> None:
    """A checkpoint's weights into ``parts`` built from its ``cfg``: base + adapters for a LoRA checkpoint."""
    if cfg.lora.enabled:
        load_lora_base(cfg, parts)
        load_weights(path, parts, trainable_only=True)  # the adapters (and any new head)
    else:
        load_weights(path, parts)


def freeze(parts: list[nn.Module]) -> list[nn.Module]:
    for part in parts:
        part.requires_grad_(False)
        part.eval()
    return parts


def build_frozen(policy_cfg: JobConfig, engine, policy_objective, checkpoint: str | None = None,
                 adapt: Callable[[nn.Module], None] | None = None) -> list[nn.Module]:
    """A frozen model laid out like the policy (see ObjectiveContext). ``checkpoint=None``: the policy's
    starting weights without LoRA (its ``checkpoint.init_from``, else the seeded initialisation)."""
    from meshlm.objectives import build_objective

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
    adapt_meta_model(model, objective, cfg)
    if adapt is not None:
        adapt(model)
    # No activation checkpointing or compile: the copy only runs forward under no_grad.
    training = dataclasses.replace(policy_cfg.training, activation_checkpointing="none", compile=False)
    parts = engine.parallelize(model, training, None, 1, frozen=True)
    if path is not None:
        load_checkpoint_weights(path, cfg, parts)
    return freeze(parts)


@torch.no_grad()
def rebuild_on_device(path: Path, cfg: JobConfig, device: torch.device | str) -> nn.Module:
    """The model of a checkpoint on one device (generate, convert, inspect): adapted as its objective says, with
    base + adapters for a LoRA checkpoint."""
    from meshlm.distributed.init import materialize
    from meshlm.objectives import build_objective

    model = meta_model(cfg.model)
    adapt_meta_model(model, build_objective(cfg.training.objective, cfg.objective), cfg)
    materialize(model, device, cfg.training.seed)
    load_checkpoint_weights(path, cfg, [model])
    return model.eval()
