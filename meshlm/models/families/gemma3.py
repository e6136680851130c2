"""The gemma3 family: Gemma 3's text decoder (Gemma3ForCausalLM, model_type gemma3_text; the text backbone of
Gemma3ForConditionalGeneration) as flags of the generic block (meshlm/models/llama.py):

- (1 + w) RMSNorm (``norm_unit_offset``: weights stored as an offset from one), also on each head's q and k;
- norms before and after attention and before and after the MLP (``post_norms``);
- GeGLU with tanh-approximated GELU (``mlp_activation = "gelu_tanh"``);
- scores scaled by ``query_pre_attn_scalar ** -0.5``; embeddings scaled by sqrt(dim); a tied head;
- a per-layer kind list (``layer_kinds``: sliding with ``sliding_window``, or global), RoPE base ``rope_theta`` on
  global layers and ``rope_local_theta`` on sliding ones.

Every value is read from the HF config (``text_config`` of a Gemma3ForConditionalGeneration), with transformers'
own default where a key is absent. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshlm.errors import CheckpointError, ConfigError
from meshlm.models.family import LINEARS, QK_NORMS, TOP_GGUF, TOP_HF, FamilySpec, Norm

ARCHITECTURE = "Gemma3ForCausalLM"
MODEL_TYPE = "gemma3_text"
# The block flags every Gemma 3 model has (models built from scratch and converted ones alike).
FLAGS = {"norm_unit_offset": True, "post_norms": True, "mlp_activation": "gelu_tanh", "scale_embeddings": True,
         "qk_norm": True, "qkv_bias": False}
# transformers' Gemma3TextConfig defaults, for keys a config.json leaves out (as transformers itself reads it).
_HF_DEFAULTS = {"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "sliding_window": 4096,
                "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "rms_norm_eps": 1e-6,
                "tie_word_embeddings": True, "sliding_window_pattern": 6, "initializer_range": 0.02,
                "num_key_value_heads": 4, "head_dim": 256}
_KINDS = {"sliding_attention": "sliding", "full_attention": "global"}
# Gemma's turn format: "<start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n...<end_of_turn>\n"; no
# system role (a system message opens the first turn, before a blank line). A base model's GGUF carries no
# template; converting one writes this, so SFT and chat have Gemma's own turns rather than none.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\n' + "
    "(system if loop.first else '') + m['content'] + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


def text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The text decoder's config: ``text_config`` of a Gemma3ForConditionalGeneration, else the config itself."""
    return hf.get("text_config") or hf


def _get(hf: dict[str, Any], key: str) -> Any:
    value = hf.get(key)
    return _HF_DEFAULTS[key] if value is None else value


def _int(hf: dict[str, Any], key: str, source: Path) -> int:
    if not isinstance(hf.get(key), int) or isinstance(hf.get(key), bool):
        raise CheckpointError(f"{source}: '{key}' is missing or not an integer; is this a complete config.json?")
    return hf[key]


def _refuse(hf: dict[str, Any], source: Path) -> None:
    """Settings that change the computation in ways meshlm does not implement."""
    if _get(hf, "hidden_activation") not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise CheckpointError(f"{source}: hidden_activation '{hf['hidden_activation']}' is not supported for gemma3 "
                              "(meshlm's GeGLU uses the tanh-approximated GELU)")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if hf.get(key) is not None:
            raise CheckpointError(f"{source}: {key} = {hf[key]} is not supported (Gemma 3 has none; meshlm neither)")
    if hf.get("attention_bias") or hf.get("use_bidirectional_attention"):
        raise CheckpointError(f"{source}: attention_bias / use_bidirectional_attention are not supported for gemma3")


def layer_kinds_from_hf(hf: dict[str, Any], n_layers: int, source: Path) -> list[str]:
    """``layer_types`` ("sliding_attention" / "full_attention"), or the ``sliding_window_pattern`` rule
    transformers derives it by (every pattern-th layer global)."""
    pattern = _get(hf, "sliding_window_pattern")
    types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                      for i in range(n_layers)]
    if len(types) != n_layers or any(t not in _KINDS for t in types):
        raise CheckpointError(f"{source}: 'layer_types' must list {n_layers} of sliding_attention / full_attention, "
                              f"got {types}")
    return [_KINDS[t] for t in types]


def _rope(hf: dict[str, Any], source: Path) -> dict[str, Any]:
    """Global and local RoPE bases (transformers 5's per-kind ``rope_parameters`` or 4.x's ``rope_theta`` +
    ``rope_local_base_freq``) and the global layers' scaling (none, or linear)."""
    params = hf.get("rope_parameters") or {}
    full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    scaling = hf.get("rope_scaling") or full
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    fields: dict[str, Any] = {"rope_theta": float(full.get("rope_theta", _get(hf, "rope_theta"))),
                              "rope_local_theta": float(local.get("rope_theta", _get(hf, "rope_local_base_freq"))),
                              "rope_scaling": "none"}
    if local.get("rope_type", "default") != "default":
        raise CheckpointError(f"{source}: RoPE scaling on the sliding layers is not supported")
    if kind == "linear":
        fields.update(rope_scaling="linear", rope_scaling_factor=float(scaling["factor"]))
    elif kind != "default":
        raise CheckpointError(f"{source}: RoPE scaling '{kind}' is not supported for gemma3; meshlm implements "
                              "none and linear")
    return fields


def config_from_hf(hf: dict[str, Any], source: Path):
    """(the ModelConfig, notes for the user) from a parsed Gemma 3 config.json."""
    from meshlm.models.config import ModelConfig

    text = text_config(hf)
    _refuse(text, source)
    dim, n_heads, n_layers = (_int(text, k, source) for k in ("hidden_size", "num_attention_heads",
                                                              "num_hidden_layers"))
    kinds = layer_kinds_from_hf(text, n_layers, source)
    window = int(_get(text, "sliding_window") or 0)  # kept with no sliding layer too: written back as read
    cfg = ModelConfig(
        flavor="custom", family="gemma3", dim=dim, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=int(_get(text, "num_key_value_heads")), head_dim=int(_get(text, "head_dim")),
        ffn_hidden_dim=_int(text, "intermediate_size", source), vocab_size=_int(text, "vocab_size", source),
        max_seq_len=_int(text, "max_position_embeddings", source), norm_eps=float(_get(text, "rms_norm_eps")),
        tie_embeddings=bool(_get(text, "tie_word_embeddings")), init_std=float(_get(text, "initializer_range")),
        sliding_window=window, layer_kinds=kinds,
        query_pre_attn_scalar=float(_get(text, "query_pre_attn_scalar")), **FLAGS, **_rope(text, source))
    try:
        cfg.validate()
    except ConfigError as exc:
        raise CheckpointError(f"{source}: the model shape is not valid for meshlm ({exc})") from None
    sliding = [i for i, k in enumerate(kinds) if k == "sliding"]
    notes = [f"gemma3: sliding attention window of {window} tokens on {len(sliding)} of {n_layers} layers"] \
        if sliding else []
    return cfg, notes


def config_to_hf(cfg: Any, bos_id: int | None, eos_ids: list[int] | None, pad_id: int | None,
                 dtype: str = "float32") -> dict[str, Any]:
    """A Gemma3ForCausalLM config.json (model_type gemma3_text) that transformers 4.50+ and 5.x load."""
    if not cfg.tie_embeddings:
        raise CheckpointError("a gemma3 model without tied embeddings has no Hugging Face form (Gemma3ForCausalLM "
                              "ties its head to the embedding)")
    kinds = cfg.resolved_layer_kinds()
    global_rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "linear":
        global_rope = {"rope_type": "linear", "factor": cfg.rope_scaling_factor, "rope_theta": cfg.rope_theta}
    eos = None if not eos_ids else eos_ids[0] if len(eos_ids) == 1 else list(eos_ids)
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim, "intermediate_size": cfg.ffn_hidden_dim, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.resolved_head_dim, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
        "query_pre_attn_scalar": _number(cfg.query_pre_attn_scalar or cfg.resolved_head_dim),
        "sliding_window": cfg.sliding_window or None,
        "layer_types": ["sliding_attention" if k == "sliding" else "full_attention" for k in kinds],
        "rope_theta": cfg.rope_theta, "rope_local_base_freq": cfg.rope_local_theta or cfg.rope_theta,
        "rope_scaling": global_rope if cfg.rope_scaling == "linear" else None,
        "rope_parameters": {"full_attention": global_rope,
                            "sliding_attention": {"rope_type": "default",
                                                  "rope_theta": cfg.rope_local_theta or cfg.rope_theta}},
        "final_logit_softcapping": None, "attn_logit_softcapping": None, "attention_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": True, "initializer_range": cfg.init_std,
        "bos_token_id": bos_id, "eos_token_id": eos, "pad_token_id": pad_id, "use_cache": True,
        "dtype": dtype, "torch_dtype": dtype,
    }


def _number(value: float) -> int | float:
    """An integral value as an int (transformers 5 validates query_pre_attn_scalar as an int)."""
    return int(value) if float(value).is_integer() else value


def config_from_gguf(meta: dict[str, Any], arch: str) -> dict[str, Any]:
    """The gemma3 ModelConfig fields of a llama.cpp file beyond the common shape keys (dim, heads, ...), as
    llama.cpp runs it: every sixth layer global (llama.cpp's fixed pattern, unless the file lists
    ``{arch}.attention.sliding_window_pattern``), local RoPE base 10000 (fixed in llama.cpp), scores scaled by
    key_length ** -0.5 (llama.cpp's rule for every size but 27B, which uses dim / heads), a tied head unless
    the file has output.weight (the caller decides that)."""
    n_layers = int(meta[f"{arch}.block_count"])
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", 6)
    window = int(meta.get(f"{arch}.attention.sliding_window", 0) or 0)
    dim, heads = int(meta[f"{arch}.embedding_length"]), int(meta[f"{arch}.attention.head_count"])
    head_dim = meta.get(f"{arch}.attention.key_length") or dim // heads
    scalar = dim // heads if n_layers == 62 else head_dim  # llama.cpp: 62 layers is 27B (src/models/gemma3.cpp)
    kinds = ["sliding" if (i + 1) % pattern else "global" for i in range(n_layers)] if window else []
    return {"family": "gemma3", **FLAGS, "sliding_window": window, "layer_kinds": kinds,
            "rope_local_theta": float(meta.get(f"{arch}.rope.local.freq_base", 10_000.0)),
            "query_pre_attn_scalar": float(scalar), "tie_embeddings": True}


SPEC = FamilySpec(
    name="gemma3",
    linears=LINEARS,
    norms=(
        Norm("attention_norm", "input_layernorm", "attn_norm", lambda s: s.dim),
        *QK_NORMS,
        Norm("post_attention_norm", "post_attention_layernorm", "post_attention_norm", lambda s: s.dim, "post_norms"),
        Norm("ffn_norm", "pre_feedforward_layernorm", "ffn_norm", lambda s: s.dim),
        Norm("post_ffn_norm", "post_feedforward_layernorm", "post_ffw_norm", lambda s: s.dim, "post_norms"),
    ),
    top_hf=TOP_HF,
    top_gguf=TOP_GGUF,
    hf_architectures=(ARCHITECTURE, "Gemma3ForConditionalGeneration"),
    hf_model_types=(MODEL_TYPE, "gemma3"),
    hf_config_in=config_from_hf,
    hf_text_prefixes=("model.language_model.", "language_model.model."),  # transformers 5 / 4.5x layouts
    hf_skip_prefixes=("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
                      "multi_modal_projector.", "language_model.lm_head."),
    hf_config_out=config_to_hf,
    gguf_architectures=("gemma3",),
    gguf_interleaved_qk=(),  # llama.cpp runs Gemma with NeoX-style RoPE: rows stay in rotate-half order
    gguf_norm_offset=1.0,  # llama.cpp's converter stores Gemma's norm weights as 1 + w
    gguf_config_in=config_from_gguf,
    tokenizer="sentencepiece",
    chat_template=CHAT_TEMPLATE,
    chat_tokens=("<start_of_turn>", "<end_of_turn>"),
    packed_decode=True,  # post-norms, GeGLU, (1 + w) norms, per-kind RoPE: meshlm/generate/decode.py
    flags=FLAGS,
)
