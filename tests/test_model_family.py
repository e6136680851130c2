"""The model family spec (meshlm/models/family.py) against the real decoder, transformers' models and the
planner: one place for module names, and every reader agrees with it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from meshlm.models import ModelConfig, flavor_config
from meshlm.models.family import DECODER
from meshlm.models.llama import Transformer
from meshlm.models.lora import HF_TARGETS, TARGETS, expected_lora_params
from meshlm.planner.model_spec import ModelSpec

from meshlm.models.families import FAMILIES, family_spec

# Every family of the catalog, with the flag variants of its block: (family, ModelConfig overrides).
VARIANTS = {"llama": ("llama", {}), "qwen2": ("llama", {"qkv_bias": True}),
            "qwen3": ("llama", {"qk_norm": True, "head_dim": 24}), "gemma3": ("gemma3", {})}
# Each family's llama.cpp architectures and a transformers model class of it (the independent references).
REFERENCES = {"llama": ("llama", "qwen3"), "gemma3": ("gemma3",)}


def family_config(family: str, **overrides) -> ModelConfig:
    """A tiny config of ``family``: the debug shape with the family's flags."""
    flags = family_spec(family).flags or {}
    return dataclasses.replace(flavor_config("debug"), family=family, **{**flags, **overrides})


def _meta_model(family: str = "llama", **flags) -> Transformer:
    with torch.device("meta"):
        return Transformer(family_config(family, **flags))


def test_every_family_of_the_catalog_is_covered_here():
    assert {family for family, _ in VARIANTS.values()} == set(FAMILIES) == set(REFERENCES)


@pytest.mark.parametrize("variant", VARIANTS)
def test_spec_names_every_tensor_with_distinct_names_llama_cpp_knows(variant):
    """Every tensor has one HF and one GGUF name, no two tensors share one, and each GGUF name is one llama.cpp's
    gguf package lists for the family's architectures (gguf.constants, not the spec: an independent list)."""
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES

    family, flags = VARIANTS[variant]
    spec = family_spec(family)
    model = _meta_model(family, **flags)
    keys = list(model.state_dict())
    hf = [spec.external_name(k, "hf") for k in keys]
    gguf = [spec.external_name(k, "gguf") for k in keys]
    assert len(set(hf)) == len(hf) == len(set(gguf))
    known = {TENSOR_NAMES[t].replace("{bid}", str(i)) for arch in REFERENCES[family]
             for t in MODEL_TENSORS[getattr(MODEL_ARCH, arch.upper())] for i in range(model.cfg.n_layers)}
    stems = {name.rsplit(".", 1)[0] for name in gguf}  # without .weight / .bias
    assert stems <= known, sorted(stems - known)
    for lin in spec.linears:  # the LoRA targets and the TP plan's modules exist in every block
        assert isinstance(model.layers["0"].get_submodule(lin.module), torch.nn.Linear)


@pytest.mark.parametrize("variant", ["llama", "qwen2", "qwen3"])
def test_planner_counts_the_decoder_block_tensor_for_tensor(variant):
    model = _meta_model(*VARIANTS[variant][:1], **VARIANTS[variant][1])
    cfg = model.cfg
    spec = ModelSpec("x", "llama", cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_hidden_dim,
                     cfg.vocab_size, head_dim=cfg.head_dim, qkv_bias=cfg.qkv_bias, qk_norm=cfg.qk_norm)
    real = {name: tuple(p.shape) for name, p in model.layers["0"].named_parameters()}
    assert {t.name: t.shape for t in spec.block_tensors()} == real


def test_hf_names_match_transformers_models():
    """transformers' own Llama, Qwen3 and Gemma 3 state dicts use each family's names (tiny random models)."""
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)

    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=64, tie_word_embeddings=False)
    shape = dict(dim=32, ffn_hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64)
    cases = (("llama", {"tie_embeddings": False}, LlamaForCausalLM(LlamaConfig(**common))),
             ("llama", {"qk_norm": True, "head_dim": 8, "tie_embeddings": False},
              Qwen3ForCausalLM(Qwen3Config(head_dim=8, **common))),
             ("gemma3", {"head_dim": 8, "tie_embeddings": True},
              Gemma3ForCausalLM(Gemma3TextConfig(head_dim=8, **{**common, "tie_word_embeddings": True}))))
    for family, flags, hf_model in cases:
        with torch.device("meta"):
            ours = Transformer(family_config(family, **shape, **flags))
        theirs = {k for k in hf_model.state_dict() if not k.endswith("rotary_emb.inv_freq")}
        names = {family_spec(family).external_name(k, "hf") for k in ours.state_dict()}
        assert names == theirs | ({"lm_head.weight"} if family == "gemma3" else set())


def test_lora_reads_targets_and_shapes_from_the_spec():
    assert TARGETS["gate"] == "feed_forward.w1" and HF_TARGETS["down"] == "down_proj"
    assert DECODER.lora_targets == ("q", "k", "v", "o", "gate", "up", "down")
    model = _meta_model()
    cfg = model.cfg
    # r · (in + out) per target per layer equals the real projections' sizes
    by_hand = cfg.n_layers * sum(4 * sum(model.layers["0"].get_submodule(TARGETS[t]).weight.shape)
                                 for t in ("q", "v", "down"))
    assert expected_lora_params(cfg, ["q", "v", "down"], 4) == by_hand
