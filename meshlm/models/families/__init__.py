"""The catalog of model families: name -> the module that holds everything the family is (torch-free).

A family is one module, ``meshlm/models/families/<name>.py``, exposing ``SPEC``: a
:class:`~meshlm.models.family.FamilySpec` with its module names, its Hugging Face and llama.cpp names and config
mappers, its tokenizer kind, its tensor-parallel styles (per projection), whether the packed decode block serves
it, and the flags the generic block (meshlm/models/llama.py) takes. Readers take the spec from the model's config
(``model.family``, written into every checkpoint), never from an import of one family: :func:`family_spec`.
Adding a family: a module here and its line in ``FAMILIES`` (docs/architecture.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from meshlm.errors import ConfigError

if TYPE_CHECKING:
    from meshlm.models.config import ModelConfig
    from meshlm.models.family import FamilySpec

# Family name -> its module. Mistral, Qwen2 and Qwen3 are the llama family with flags (a window, q/k/v bias, q/k
# norms): the same module names, so the same spec.
FAMILIES = {"llama": "meshlm.models.families.llama", "gemma3": "meshlm.models.families.gemma3"}


def family_spec(name: str) -> FamilySpec:
    """The spec of family ``name``; an unknown name is a one-line ConfigError naming the known ones."""
    if name not in FAMILIES:
        raise ConfigError(f"model.family: unknown model family '{name}'; known: {', '.join(FAMILIES)}")
    return importlib.import_module(FAMILIES[name]).SPEC


def spec_of(cfg: ModelConfig) -> FamilySpec:
    """The spec of the family a model config names (``model.family``)."""
    return family_spec(cfg.family)


def supports_packed(cfg: ModelConfig) -> bool:
    """Whether the packed decode block (meshlm/generate/packed.py) serves this model: its family declares one. Any
    other model decodes on its plain forward."""
    return spec_of(cfg).packed_decode


def family_of_hf(hf: dict) -> str:
    """The family whose spec names the architecture (or model_type) of a parsed HF config.json; "" if none."""
    names = set(hf.get("architectures") or []) | {hf.get("model_type")}
    for name in FAMILIES:
        spec = family_spec(name)
        if names & (set(spec.hf_architectures) | set(spec.hf_model_types)):
            return name
    return ""


def family_of_gguf(arch: str) -> str:
    """The family that reads llama.cpp architecture ``arch`` (general.architecture); "" if none."""
    return next((name for name in FAMILIES if arch in family_spec(name).gguf_architectures), "")
