"""The model: config, named flavours, the Llama-family decoder and its construction."""

from __future__ import annotations

import torch

from meshlm.models.config import ModelConfig
from meshlm.models.flavors import FLAVORS, flavor_config
from meshlm.models.llama import KVCache, Transformer


def build_model(cfg: ModelConfig, device: torch.device | str, *, seed: int | None = None) -> Transformer:
    """Build on the meta device (no memory, no init work), allocate on `device`, then initialise.

    Seeding (torch.manual_seed) happens right before init_weights, so the same seed gives the same weights
    whatever was drawn from the global RNG before.
    """
    with torch.device("meta"):
        model = Transformer(cfg)
    model.to_empty(device=device)
    if seed is not None:
        torch.manual_seed(seed)
    model.init_weights(buffer_device=device)
    return model


__all__ = ["FLAVORS", "KVCache", "ModelConfig", "Transformer", "build_model", "flavor_config"]
