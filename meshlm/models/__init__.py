"""The model: config, named flavours, the Llama-family decoder and its construction."""

from __future__ import annotations

import torch

from meshlm.models.config import ModelConfig
from meshlm.models.flavors import FLAVORS, flavor_config
from meshlm.models.llama import KVCache, ParamInit, Transformer


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


__all__ = ["FLAVORS", "KVCache", "ModelConfig", "ParamInit", "Transformer", "build_model", "flavor_config",
           "meta_model"]
