"""The llama family: Llama 2/3/3.1, Mistral, Qwen2 (``qkv_bias``), Qwen3 (``qk_norm``), SmolLM2 — the generic
pre-norm block (RMSNorm, RoPE, SwiGLU, grouped-query attention) with flags. Its config.json mappers are the
ones of meshlm/interop/hf_config.py (imported on use: torch-free either way)."""

from __future__ import annotations

from typing import Any

from meshlm.models.family import LINEARS, QK_NORMS, TOP_GGUF, TOP_HF, FamilySpec, Norm


def _config_in(hf: dict[str, Any], source: Any):
    from meshlm.interop.hf_config import llama_config_from_hf

    return llama_config_from_hf(hf, source)


def _config_out(cfg: Any, bos_id: int | None, eos_ids: list[int] | None, pad_id: int | None,
                dtype: str = "float32") -> dict[str, Any]:
    from meshlm.interop.hf_config import llama_config_to_hf

    return llama_config_to_hf(cfg, bos_id, eos_ids, pad_id, dtype)


SPEC = FamilySpec(
    name="llama",
    linears=LINEARS,
    norms=(
        Norm("attention_norm", "input_layernorm", "attn_norm", lambda s: s.dim),
        *QK_NORMS,
        Norm("ffn_norm", "post_attention_layernorm", "ffn_norm", lambda s: s.dim),
    ),
    top_hf=TOP_HF,
    top_gguf=TOP_GGUF,
    hf_architectures=("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"),
    hf_model_types=("llama", "mistral", "qwen2", "qwen3"),
    hf_config_in=_config_in,
    hf_config_out=_config_out,
    gguf_architectures=("llama", "qwen2", "qwen3"),
    gguf_interleaved_qk=("llama",),  # llama.cpp writes Mistral, Llama 2/3 and SmolLM as "llama"
    tokenizer="bpe",
    packed_decode=True,
    flags={"norm_unit_offset": False, "post_norms": False, "mlp_activation": "silu", "scale_embeddings": False},
)
