"""Building the decoder: on the meta device (shapes only) with what a run changes in it (its objective's head,
LoRA), or whole on one device and initialised. The trainer, frozen reference/reward copies
(train/model_setup.py) and a checkpoint's rebuild (checkpoint/load.py) all build their model here."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from meshlm.models.config import ModelConfig
from meshlm.models.head import head_kind
from meshlm.models.init import materialize
from meshlm.models.llama import Transformer
from meshlm.models.lora import apply_lora

if TYPE_CHECKING:
    from meshlm.config.posttrain import LoRAConfig
    from meshlm.objectives.base import Objective


def meta_model(cfg: ModelConfig) -> Transformer:
    """The model on the meta device: shapes only, no memory. The engine splits and shards it, then materialises
    only this rank's shards (meshlm/models/init.py)."""
    with torch.device("meta"):
        return Transformer(cfg)


def adapt_meta_model(model: nn.Module, objective: Objective, lora: LoRAConfig) -> None:
    """The objective's change to the architecture (a score head, a value head), then LoRA (which freezes
    everything but the adapters). What the head now is goes into ``model.head`` of the config the model was built
    from (a run's ``cfg.model``, which its checkpoints write), so readers take it from the checkpoint."""
    built_from = model.cfg
    objective.adapt_model(model)
    built_from.head = model.cfg.head = head_kind(model)
    if lora.enabled:
        apply_lora(model, lora.targets, lora.rank, lora.alpha, lora.dropout)
        # Modules the objective added (a score head) are new: they train beside the adapters.
        for name in objective.new_modules:
            model.get_submodule(name).requires_grad_(True)


def build_model(cfg: ModelConfig, device: torch.device | str, *, seed: int | None = None) -> Transformer:
    """The whole model on one device, initialised from ``seed`` by the same per-parameter rule as every parallel
    layout (so a single-device run is their reference). ``seed=None`` draws a seed from torch's global RNG."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item())
    model = meta_model(cfg)
    materialize(model, device, seed)
    return model
