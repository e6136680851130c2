"""Hugging Face ``config.json`` <-> meshlm :class:`~meshlm.models.config.ModelConfig`.

The family whose spec names the architecture (meshlm/models/families/) maps the config: :func:`model_config_from_hf`
and :func:`hf_config_from_model` dispatch to it. This module holds the llama family's mappers (Llama, Mistral,
Qwen2, Qwen3). Read side: every field of the ModelConfig is set from the HF config (flavour "debug" is only the base the
loader starts from), and anything meshlm cannot compute exactly is refused with the key that causes it.
Write side: the architecture follows the flags (qk_norm -> Qwen3, qkv_bias -> Qwen2, a sliding window -> Mistral,
else Llama), and the RoPE
settings are written both in the transformers 5 form (``rope_parameters``) and the 4.x form (``rope_theta`` +
``rope_scaling``) so either version loads the folder.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from meshlm.errors import CheckpointError, ConfigError
from meshlm.models.config import ModelConfig
from meshlm.models.families import FAMILIES, family_of_hf, family_spec, spec_of

def supported_architectures() -> list[str]:
    return [arch for name in FAMILIES for arch in family_spec(name).hf_architectures]


SUPPORTED_ARCHITECTURES = tuple(supported_architectures())


def architecture_of(hf: dict[str, Any], source: Path) -> str:
    """The single supported architecture named by ``architectures`` (or ``model_type``) in config.json."""
    names = hf.get("architectures") or []
    if not names and family_of_hf(hf):
        spec = family_spec(family_of_hf(hf))
        names = [spec.hf_architectures[spec.hf_model_types.index(hf["model_type"])]]
    if len(names) != 1 or names[0] not in supported_architectures():
        raise CheckpointError(f"{source}: unsupported architecture {names or hf.get('model_type')}; meshlm converts "
                              f"{', '.join(supported_architectures())}")
    return names[0]


def model_config_from_hf(hf: dict[str, Any], source: Path) -> tuple[ModelConfig, list[str]]:
    """(the ModelConfig, notes for the user) from a parsed config.json, by the family that reads its architecture;
    refuses what meshlm cannot run exactly."""
    architecture_of(hf, source)
    return family_spec(family_of_hf(hf)).hf_config_in(hf, source)


def llama_config_from_hf(hf: dict[str, Any], source: Path) -> tuple[ModelConfig, list[str]]:
    """The llama family's reader (Llama, Mistral, Qwen2, Qwen3)."""
    arch = architecture_of(hf, source)
    _refuse_unsupported(hf, arch, source)
    dim, n_heads = _req(hf, "hidden_size", source), _req(hf, "num_attention_heads", source)
    n_layers = _req(hf, "num_hidden_layers", source)
    rope = _rope_fields(hf, source)
    window = _window_fields(hf, arch, n_layers, source)
    notes = [f"sliding attention window of {window['sliding_window']} tokens on layers "
             f"{window['full_attention_layers']}..{n_layers - 1}"] if window["sliding_window"] else []
    cfg = ModelConfig(
        flavor="debug",  # only the loader's base: every field below is explicit
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or dim // n_heads,
        ffn_hidden_dim=_req(hf, "intermediate_size", source),
        vocab_size=_req(hf, "vocab_size", source),
        max_seq_len=_req(hf, "max_position_embeddings", source),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qkv_bias=arch == "Qwen2ForCausalLM",
        qk_norm=arch == "Qwen3ForCausalLM",
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        init_std=float(hf.get("initializer_range", 0.02)),
        **rope,
        **window,
    )
    try:
        cfg.validate()
    except ConfigError as exc:
        raise CheckpointError(f"{source}: the model shape is not valid for meshlm ({exc})") from None
    return cfg, notes


def _req(hf: dict[str, Any], key: str, source: Path) -> Any:
    if not isinstance(hf.get(key), int) or isinstance(hf.get(key), bool):
        raise CheckpointError(f"{source}: '{key}' is missing or not an integer; is this a complete config.json?")
    return hf[key]


def _refuse_unsupported(hf: dict[str, Any], arch: str, source: Path) -> None:
    """Settings that would change the computation in ways the meshlm decoder does not implement."""
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{source}: hidden_act '{hf['hidden_act']}' is not supported (meshlm's MLP is SwiGLU "
                              "with silu)")
    # Llama/Mistral/Qwen3 `attention_bias` also puts a bias on o_proj, which meshlm's wo never has (Qwen2's
    # q/k/v bias is implied by the architecture and handled by qkv_bias).
    if arch != "Qwen2ForCausalLM" and hf.get("attention_bias"):
        raise CheckpointError(f"{source}: attention_bias = true (a bias on q/k/v/o projections) is not supported "
                              f"for {arch}; meshlm has q/k/v bias only in the Qwen2 layout")
    if hf.get("mlp_bias"):
        raise CheckpointError(f"{source}: mlp_bias = true is not supported (meshlm's MLP has no bias)")
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if hf.get(key):
            raise CheckpointError(f"{source}: '{key}' = {hf[key]}: Mixture-of-Experts models are not supported")
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError(f"{source}: partial_rotary_factor {hf['partial_rotary_factor']} is not supported "
                              "(meshlm rotates the whole head)")


def _window_fields(hf: dict[str, Any], arch: str, n_layers: int, source: Path) -> dict[str, int]:
    """model.sliding_window / full_attention_layers, as transformers decides per architecture.

    Mistral: ``sliding_window`` (null: none) on every layer. Qwen2 / Qwen3: only with ``use_sliding_window``,
    on the layers ``layer_types`` marks "sliding_attention" (by default those from ``max_window_layers`` on);
    meshlm represents "the first N layers full, the rest windowed", and refuses any other pattern.
    """
    window = hf.get("sliding_window")
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and not hf.get("use_sliding_window", False):
        window = None
    if arch == "LlamaForCausalLM" or not window:
        return {"sliding_window": 0, "full_attention_layers": 0}
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise CheckpointError(f"{source}: 'sliding_window' = {window!r} must be a positive integer or null")
    if arch == "MistralForCausalLM":
        return {"sliding_window": window, "full_attention_layers": 0}
    first = hf.get("max_window_layers", n_layers)
    layer_types = hf.get("layer_types") or ["sliding_attention" if i >= first else "full_attention"
                                            for i in range(n_layers)]
    windowed = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    first = windowed[0] if windowed else n_layers
    if windowed != list(range(first, n_layers)) or len(layer_types) != n_layers:
        raise CheckpointError(f"{source}: 'layer_types' puts sliding-window attention on layers {windowed}; meshlm "
                              "supports a window on the last layers only (full attention on the first "
                              "max_window_layers)")
    return {"sliding_window": window if windowed else 0, "full_attention_layers": first if windowed else 0}


def _rope_fields(hf: dict[str, Any], source: Path) -> dict[str, Any]:
    """RoPE settings. transformers 5 writes ``rope_parameters`` (with rope_theta inside); 4.x wrote top-level
    ``rope_theta`` and ``rope_scaling`` (with ``type`` in old files). Like transformers 5, rope_scaling wins."""
    params = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    fields: dict[str, Any] = {"rope_theta": theta, "rope_scaling": "none"}
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    for key in ("rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_len"):
        fields[key] = defaults[key]  # unused without scaling, but explicit in the written config
    if rope_type == "default":
        return fields
    if rope_type != "llama3":
        raise CheckpointError(f"{source}: RoPE scaling '{rope_type}' is not supported; meshlm implements none "
                              "and llama3 (Llama 3.1)")
    try:
        fields.update(rope_scaling="llama3", rope_scaling_factor=float(params["factor"]),
                      rope_low_freq_factor=float(params["low_freq_factor"]),
                      rope_high_freq_factor=float(params["high_freq_factor"]),
                      rope_original_max_len=int(params.get("original_max_position_embeddings")
                                                or hf.get("original_max_position_embeddings")
                                                or hf["max_position_embeddings"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: llama3 RoPE scaling lacks or mistypes {exc}; expected factor, "
                              "low_freq_factor, high_freq_factor, original_max_position_embeddings") from None
    return fields


# ----------------------------------------------------------------------------------------------- write side
def hf_architecture(cfg: ModelConfig) -> str:
    if cfg.layer_kinds:
        raise CheckpointError("a per-layer kind list (model.layer_kinds) has no Llama/Mistral/Qwen form in Hugging "
                              "Face; write the windowed layers as sliding_window + full_attention_layers")
    if cfg.qk_norm and cfg.qkv_bias:
        raise CheckpointError("the model has both qk_norm and qkv_bias; no Hugging Face architecture has exactly "
                              "that (Qwen3 with attention_bias also adds an o_proj bias)")
    if cfg.qk_norm or cfg.qkv_bias:
        return "Qwen3ForCausalLM" if cfg.qk_norm else "Qwen2ForCausalLM"
    if not cfg.sliding_window:
        return "LlamaForCausalLM"
    if cfg.full_attention_layers:
        raise CheckpointError("a window on some layers only (model.full_attention_layers > 0) exists in HF for "
                              "Qwen2/Qwen3 (qkv_bias / qk_norm), not for a Llama/Mistral-shaped model")
    return "MistralForCausalLM"


def hf_config_from_model(cfg: ModelConfig, bos_id: int | None, eos_ids: list[int] | None,
                         pad_id: int | None, dtype: str = "float32") -> dict[str, Any]:
    """A config.json that transformers 4.45+ and 5.x load with no custom code, written by the model's family;
    ``dtype`` names the weights' torch dtype (float32, bfloat16, float16)."""
    return spec_of(cfg).hf_config_out(cfg, bos_id, eos_ids, pad_id, dtype)


def llama_config_to_hf(cfg: ModelConfig, bos_id: int | None, eos_ids: list[int] | None, pad_id: int | None,
                       dtype: str = "float32") -> dict[str, Any]:
    """The llama family's writer: transformers 4.45+ and 5.x load it."""
    arch = hf_architecture(cfg)
    spec = spec_of(cfg)
    rope_parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    rope_scaling = None
    if cfg.rope_scaling == "llama3":
        rope_scaling = {"rope_type": "llama3", "factor": cfg.rope_scaling_factor,
                        "low_freq_factor": cfg.rope_low_freq_factor, "high_freq_factor": cfg.rope_high_freq_factor,
                        "original_max_position_embeddings": cfg.rope_original_max_len}
        rope_parameters = {**rope_scaling, "rope_theta": cfg.rope_theta}
    eos = None if not eos_ids else eos_ids[0] if len(eos_ids) == 1 else list(eos_ids)
    out: dict[str, Any] = {
        "architectures": [arch],
        "model_type": spec.hf_model_types[spec.hf_architectures.index(arch)],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.resolved_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": rope_parameters,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": 0.0,
        "initializer_range": cfg.init_std,
        "bos_token_id": bos_id,
        "eos_token_id": eos,
        "pad_token_id": pad_id,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
    }
    window = cfg.sliding_window or None
    if arch == "LlamaForCausalLM":
        out.update(attention_bias=False, mlp_bias=False)
    elif arch == "MistralForCausalLM":
        out.update(sliding_window=window)
    else:  # Qwen2 / Qwen3: layers from max_window_layers on use the window
        out.update(use_sliding_window=window is not None, sliding_window=window,
                   max_window_layers=cfg.full_attention_layers if window else cfg.n_layers)
        if arch == "Qwen3ForCausalLM":
            out.update(attention_bias=False)
    return out


def transformers_model(cfg: ModelConfig):
    """An untrained transformers model with meshlm's architecture and shapes (the config.json export writes),
    sdpa attention — the in-process reference of the benchmarks. Needs the transformers package."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = hf_config_from_model(cfg, None, None, None)
    fields.pop("architectures")
    hf_cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    return AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="sdpa")
