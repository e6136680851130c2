"""The model: config, named flavours, the Llama-family decoder and its construction.

The config and the flavours are plain dataclasses; the decoder needs torch. The config layer (and through it the
CLI's argument parsing) imports ``meshlm.models.config``, which runs this file first, so the torch-backed names
are imported on first use (PEP 562) rather than here: ``meshlm --help`` then never loads torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from meshlm.models.config import ModelConfig
from meshlm.models.flavors import FLAVORS, flavor_config

_LAZY = {"KVCache": "meshlm.models.llama", "ParamInit": "meshlm.models.llama", "Transformer": "meshlm.models.llama",
         "build_model": "meshlm.models.build", "meta_model": "meshlm.models.build"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'meshlm.models' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = ["FLAVORS", "KVCache", "ModelConfig", "ParamInit", "Transformer", "build_model", "flavor_config",
           "meta_model"]
