"""Named model shapes. Published shapes follow each model's released config.json."""

from __future__ import annotations

from typing import Any

from meshlm.errors import ConfigError
from meshlm.models.config import ModelConfig
from meshlm.sections import did_you_mean

_LLAMA3 = dict(vocab_size=128256, n_kv_heads=8, norm_eps=1e-5, rope_theta=500000.0, rope_scaling="llama3",
               rope_scaling_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
               rope_original_max_len=8192, max_seq_len=131072)

FLAVORS: dict[str, dict[str, Any]] = {
    # Tiny, for tests: 4 layers so every pipeline layout (pp 2, interleaved 2x2) can be exercised.
    "debug": dict(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden_dim=192, vocab_size=2048,
                  max_seq_len=256),
    # A few million parameters: the demo on two CPU cores.
    "small": dict(dim=256, n_layers=6, n_heads=8, n_kv_heads=4, ffn_hidden_dim=704, vocab_size=4096,
                  max_seq_len=512, tie_embeddings=True),
    # Llama 3.1 8B / 70B / 405B (the 3.1 RoPE scaling; the same shapes as Llama 3).
    "llama3-8b": dict(dim=4096, n_layers=32, n_heads=32, ffn_hidden_dim=14336, **_LLAMA3),
    "llama3-70b": dict(dim=8192, n_layers=80, n_heads=64, ffn_hidden_dim=28672, **_LLAMA3),
    "llama3-405b": dict(dim=16384, n_layers=126, n_heads=128, ffn_hidden_dim=53248, **_LLAMA3),
    # Llama 3.2 1B: a size one GPU trains comfortably (the GPU benchmark's default).
    "llama3.2-1b": dict(dim=2048, n_layers=16, n_heads=32, ffn_hidden_dim=8192, tie_embeddings=True,
                        **{**_LLAMA3, "rope_scaling_factor": 32.0}),
    "qwen2.5-7b": dict(dim=3584, n_layers=28, n_heads=28, n_kv_heads=4, ffn_hidden_dim=18944, vocab_size=152064,
                       norm_eps=1e-6, rope_theta=1000000.0, qkv_bias=True, max_seq_len=32768),
    # Mistral 7B v0.3.
    "mistral-7b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden_dim=14336, vocab_size=32768,
                       norm_eps=1e-5, rope_theta=1000000.0, max_seq_len=32768),
    # Gemma 3 270M (its released config.json): the gemma3 family's flags, a window of 512 on five of six layers.
    "gemma3-270m": dict(family="gemma3", dim=640, n_layers=18, n_heads=4, n_kv_heads=1, head_dim=256,
                        ffn_hidden_dim=2048, vocab_size=262144, max_seq_len=32768, norm_eps=1e-6,
                        rope_theta=1000000.0, rope_local_theta=10000.0, sliding_window=512,
                        layer_kinds=["global" if (i + 1) % 6 == 0 else "sliding" for i in range(18)],
                        query_pre_attn_scalar=256.0, tie_embeddings=True, qk_norm=True, norm_unit_offset=True,
                        post_norms=True, mlp_activation="gelu_tanh", scale_embeddings=True),
}


def flavor_config(name: str) -> ModelConfig:
    """The full ModelConfig of a named flavour."""
    if name not in FLAVORS:
        raise ConfigError(f"model.flavor: unknown flavour '{name}'{did_you_mean(name, FLAVORS)}; "
                          f"known: {', '.join(FLAVORS)}")
    cfg = ModelConfig(**{**FLAVORS[name], "flavor": name})  # every other key at its default
    cfg.validate()
    return cfg
