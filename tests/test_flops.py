"""Parameter and FLOP counts from one place (meshlm/models/counts.py): against the real model's tensors (built on
the meta device), against the hand formula with sliding windows, and the same figures from every reader
(ModelConfig, the planner's ModelSpec and step time, the training MFU)."""

from __future__ import annotations

import dataclasses

import pytest
from torch import nn

from meshlm.models import FLAVORS, counts, flavor_config
from meshlm.models.build import meta_model
from meshlm.planner import timing
from meshlm.planner.hardware import PRESETS, declared_peak
from meshlm.planner.model_spec import from_model_config
from meshlm.train.flops import model_flops_per_token


def tiny_gemma3(**overrides):
    """The gemma3-270m flavour's flags and layer pattern (five sliding layers, then a global one) at a tiny size."""
    cfg = dataclasses.replace(flavor_config("gemma3-270m"), dim=64, n_layers=6, n_heads=4, n_kv_heads=1,
                              head_dim=32, ffn_hidden_dim=96, vocab_size=512, max_seq_len=64, sliding_window=8,
                              layer_kinds=["sliding"] * 5 + ["global"], **overrides)
    cfg.validate()
    return cfg


def matmul_weights(model: nn.Module) -> int:
    """Weights the model multiplies per token, read off its modules: every nn.Linear's weight (the output head
    too, tied or not), no embedding table, norm or bias."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize("name", ["gemma3-270m", "debug", "qwen2.5-7b"])
def test_counts_match_the_model_tensors(name):
    cfg = flavor_config(name)
    model = meta_model(cfg)
    assert cfg.num_params() == sum(p.numel() for p in model.parameters())  # a tied head once
    assert counts.matmul_params(counts.shape_of(cfg)) == matmul_weights(model)


def test_gemma3_block_has_four_norms_qk_norms_and_three_mlp_matrices():
    cfg = tiny_gemma3()
    names = [t.name for t in counts.block_tensors(counts.shape_of(cfg))]
    assert sum(n.endswith("norm.weight") and "attention." not in n for n in names) == 4
    assert {"attention.q_norm.weight", "attention.k_norm.weight"} <= set(names)
    assert sum(n.startswith("feed_forward.") for n in names) == 3  # GeGLU: gate, up, down, as SwiGLU
    block = 4 * 64 + 2 * 32 + 64 * 128 + 2 * 64 * 32 + 128 * 64 + 3 * 64 * 96
    assert cfg.num_params() == 6 * block + 64 + 512 * 64  # + final norm + the tied embedding, once


def test_sliding_windows_count_the_keys_a_query_attends():
    """Attention forward FLOPs per token = 4 · q_size · keys attended: seq on a global layer, min(window, seq) on
    a sliding one; the training count is 6 per matmul weight plus three times that."""
    cfg, seq = tiny_gemma3(), 32
    shape = counts.shape_of(cfg)
    assert shape.windows == (8, 8, 8, 8, 8, 0)
    assert counts.attention_context(shape, seq) == 5 * 8 + 32
    assert counts.attention_context(shape, 4) == 6 * 4  # a window longer than the sequence changes nothing
    expected = 6 * matmul_weights(meta_model(cfg)) + 3 * 4 * 128 * (5 * 8 + 32)
    assert model_flops_per_token(cfg, seq) == expected
    full = dataclasses.replace(cfg, sliding_window=0, layer_kinds=[])
    assert model_flops_per_token(full, seq) - expected == 3 * 4 * 128 * 5 * (32 - 8)


@pytest.mark.parametrize("name", list(FLAVORS))
def test_training_and_planner_count_alike(name):
    cfg = flavor_config(name)
    spec = from_model_config(cfg)
    assert spec.num_params() == cfg.num_params()
    for seq in (256, 8192):
        assert timing.model_flops_per_token(spec, seq) == model_flops_per_token(cfg, seq)


def test_planner_step_flops_sum_the_stages_windows():
    """The planner's per-rank FLOPs over a 2-stage pipeline add up to the whole model's count (each stage's own
    layers' windows), and a step without recompute counts what the model count says."""
    from meshlm.planner.layout import Layout, Training

    spec = from_model_config(tiny_gemma3())
    training = Training(32, 4, "fp32", efficiency=0.5)
    layout = Layout(pp=2, microbatches=2, sharding="none")
    model_flops = sum(timing.rank_flops(spec, layout, training, r)[1] for r in range(2))
    assert model_flops == pytest.approx(timing.model_flops_per_token(spec, 32) * training.tokens, rel=1e-12)


def test_gpu_peaks_come_from_the_hardware_presets():
    assert declared_peak("NVIDIA A100-SXM4-80GB", "bf16") == (312e12, "A100")
    assert declared_peak("NVIDIA H100 80GB HBM3", "fp32") == (PRESETS["h100-80gb"].peak("fp32"), "H100")
    assert declared_peak("AMD Instinct MI300X", "fp16") == (PRESETS["mi300x-192gb"].peak("bf16"), "MI300X")
    assert declared_peak("NVIDIA GeForce RTX 4090", "bf16") is None
