"""Building the decoder: on the meta device (shapes only), or whole on one device and initialised."""

from __future__ import annotations

import torch

from meshlm.models.config import ModelConfig
from meshlm.models.llama import Transformer


def meta_model(cfg: ModelConfig) -> Transformer:
    """The model on the meta device: shapes only, no memory. The engine splits and shards it, then materialises
    only this rank's shards (meshlm/distributed/init.py)."""
    with torch.device("meta"):
        return Transformer(cfg)


def build_model(cfg: ModelConfig, device: torch.device | str, *, seed: int | None = None) -> Transformer:
    """The whole model on one device, initialised from ``seed`` by the same per-parameter rule as every parallel
    layout (so a single-device run is their reference). ``seed=None`` draws a seed from torch's global RNG."""
    from meshlm.distributed.init import materialize

    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item())
    model = meta_model(cfg)
    materialize(model, device, seed)
    return model
