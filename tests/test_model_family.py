"""The model family spec (meshlm/models/family.py) against the real decoder, transformers' models and the
planner: one place for module names, and every reader agrees with it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from meshlm.interop.gguf_names import gguf_name
from meshlm.interop.hf import hf_name
from meshlm.models import flavor_config
from meshlm.models.family import DECODER
from meshlm.models.llama import Transformer
from meshlm.models.lora import HF_TARGETS, TARGETS, expected_lora_params
from meshlm.planner.model_spec import ModelSpec

FLAGS = {"llama": {}, "qwen2": {"qkv_bias": True}, "qwen3": {"qk_norm": True, "head_dim": 24}}


def _meta_model(**flags) -> Transformer:
    cfg = dataclasses.replace(flavor_config("debug"), **flags)
    with torch.device("meta"):
        return Transformer(cfg)


@pytest.mark.parametrize("family", FLAGS)
def test_spec_names_every_tensor_of_the_decoder(family):
    model = _meta_model(**FLAGS[family])
    keys = list(model.state_dict())
    for key in keys:  # the HF and GGUF maps (built from the spec) name every tensor
        assert DECODER.external_name(key, "hf") == hf_name(key)
        assert DECODER.external_name(key, "gguf") == gguf_name(key)
    block = {k.split(".", 2)[2] for k in keys if k.startswith("layers.0.")}
    assert block <= set(DECODER.layer_names("hf"))
    for lin in DECODER.linears:  # the LoRA targets and the TP plan's modules exist in every block
        assert isinstance(model.layers["0"].get_submodule(lin.module), torch.nn.Linear)


@pytest.mark.parametrize("family", FLAGS)
def test_planner_counts_the_decoder_block_tensor_for_tensor(family):
    model = _meta_model(**FLAGS[family])
    cfg = model.cfg
    spec = ModelSpec("x", "llama", cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_hidden_dim,
                     cfg.vocab_size, head_dim=cfg.head_dim, qkv_bias=cfg.qkv_bias, qk_norm=cfg.qk_norm)
    real = {name: tuple(p.shape) for name, p in model.layers["0"].named_parameters()}
    assert {t.name: t.shape for t in spec.block_tensors()} == real


def test_hf_names_match_transformers_models():
    """transformers' own Llama and Qwen3 state dicts use the spec's names (tiny random models on the CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=64, tie_word_embeddings=False)
    for flags, hf_model in (({}, LlamaForCausalLM(LlamaConfig(**common))),
                            ({"qk_norm": True, "head_dim": 8}, Qwen3ForCausalLM(Qwen3Config(head_dim=8, **common)))):
        cfg = dataclasses.replace(flavor_config("debug"), dim=32, ffn_hidden_dim=64, n_layers=2, n_heads=4,
                                  n_kv_heads=2, vocab_size=64, tie_embeddings=False, **flags)
        with torch.device("meta"):
            ours = Transformer(cfg)
        theirs = {k for k in hf_model.state_dict() if not k.endswith("rotary_emb.inv_freq")}
        assert {DECODER.external_name(k, "hf") for k in ours.state_dict()} == theirs


def test_lora_reads_targets_and_shapes_from_the_spec():
    assert TARGETS["gate"] == "feed_forward.w1" and HF_TARGETS["down"] == "down_proj"
    assert DECODER.lora_targets == ("q", "k", "v", "o", "gate", "up", "down")
    model = _meta_model()
    cfg = model.cfg
    # r · (in + out) per target per layer equals the real projections' sizes
    by_hand = cfg.n_layers * sum(4 * sum(model.layers["0"].get_submodule(TARGETS[t]).weight.shape)
                                 for t in ("q", "v", "down"))
    assert expected_lora_params(cfg, ["q", "v", "down"], 4) == by_hand
