"""The model family spec: one place for the decoder's module names and what generic code keys by them.

meshlm has one decoder (meshlm/models/llama.py) for the Llama family; Mistral, Qwen2 and Qwen3 are the same
modules with flags (a sliding window, q/k/v biases, q/k norms; interop/hf_config.py maps them to and from
``config.json``). Each projection and norm is declared here once, with

- its tensor-parallel style (column- or row-parallel; distributed/tensor_parallel.py builds the plan from it),
- its Hugging Face and llama.cpp (GGUF) names (interop/hf.py, interop/peft.py, interop/gguf_names.py),
- its LoRA target name (``lora.targets``; models/lora.py) and
- its weight shape from a config (planner/model_spec.py counts parameters from it; models/lora.py too).

A family with other module names is another :class:`FamilySpec`; the generic code reads ``DECODER`` (the only
one today) rather than naming modules itself. Torch-free: the planner and the config layer import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal

Parallel = Literal["colwise", "rowwise", "replicated"]
_LAYER_KEY = re.compile(r"^layers\.(\d+)\.(.+)$")
LAYER_PREFIX = {"hf": "model.layers", "gguf": "blk"}  # where each format keeps layer i's tensors


@dataclass(frozen=True)
class Shapes:
    """The sizes a block's tensors are made of (from a ModelConfig or the planner's ModelSpec)."""

    dim: int
    q_size: int  # n_heads · head_dim
    kv_size: int  # n_kv_heads · head_dim
    head_dim: int
    ffn_hidden_dim: int


@dataclass(frozen=True)
class Linear:
    """A projection inside a block: ``module`` (under ``layers.<i>``), ``weight`` shape (out, in)."""

    target: str  # the LoRA target name (lora.targets)
    module: str  # e.g. attention.wq
    parallel: Parallel
    hf: str  # e.g. self_attn.q_proj (under model.layers.<i>)
    gguf: str  # e.g. attn_q (under blk.<i>)
    shape: Callable[[Shapes], tuple[int, int]]
    bias_flag: str = ""  # the ModelConfig flag that adds a bias ("qkv_bias"), "" for none


@dataclass(frozen=True)
class Norm:
    """A norm weight inside a block; ``flag``: the ModelConfig flag it exists under ("" = always)."""

    module: str
    hf: str
    gguf: str
    size: Callable[[Shapes], int]
    flag: str = ""


@dataclass(frozen=True)
class FamilySpec:
    name: str
    linears: tuple[Linear, ...]  # in the block's parameter order (attention, then feed-forward)
    norms: tuple[Norm, ...]
    top_hf: dict[str, str]  # state-dict keys outside the blocks -> HF name
    top_gguf: dict[str, str]  # ... -> llama.cpp name

    def linear(self, target: str) -> Linear:
        return next(lin for lin in self.linears if lin.target == target)

    @property
    def lora_targets(self) -> tuple[str, ...]:
        return tuple(lin.target for lin in self.linears)

    def external_name(self, key: str, kind: Literal["hf", "gguf"]) -> str:
        """The HF / llama.cpp name of meshlm state-dict ``key``, e.g. layers.3.attention.wq.weight ->
        model.layers.3.self_attn.q_proj.weight (hf) or blk.3.attn_q.weight (gguf)."""
        top = self.top_hf if kind == "hf" else self.top_gguf
        if key in top:
            return top[key]
        match = _LAYER_KEY.match(key)
        names = self.layer_names(kind)
        if match and match.group(2) in names:
            return f"{LAYER_PREFIX[kind]}.{match.group(1)}.{names[match.group(2)]}"
        raise KeyError(f"no {'HF' if kind == 'hf' else 'GGUF'} name for meshlm tensor '{key}'")

    def layer_names(self, kind: Literal["hf", "gguf"]) -> dict[str, str]:
        """meshlm block state-dict key (without ``layers.<i>.``) -> the ``kind`` name (without its layer prefix)."""
        out: dict[str, str] = {}
        for norm in self.norms:
            out[f"{norm.module}.weight"] = f"{getattr(norm, kind)}.weight"
        for lin in self.linears:
            out[f"{lin.module}.weight"] = f"{getattr(lin, kind)}.weight"
            if lin.bias_flag:
                out[f"{lin.module}.bias"] = f"{getattr(lin, kind)}.bias"
        return out


def _ffn(s: Shapes) -> tuple[int, int]:
    return s.ffn_hidden_dim, s.dim


DECODER = FamilySpec(
    name="llama",  # also mistral, qwen2, qwen3 (flags of the same modules)
    linears=(
        Linear("q", "attention.wq", "colwise", "self_attn.q_proj", "attn_q", lambda s: (s.q_size, s.dim), "qkv_bias"),
        Linear("k", "attention.wk", "colwise", "self_attn.k_proj", "attn_k", lambda s: (s.kv_size, s.dim), "qkv_bias"),
        Linear("v", "attention.wv", "colwise", "self_attn.v_proj", "attn_v", lambda s: (s.kv_size, s.dim), "qkv_bias"),
        Linear("o", "attention.wo", "rowwise", "self_attn.o_proj", "attn_output", lambda s: (s.dim, s.q_size)),
        Linear("gate", "feed_forward.w1", "colwise", "mlp.gate_proj", "ffn_gate", _ffn),
        Linear("up", "feed_forward.w3", "colwise", "mlp.up_proj", "ffn_up", _ffn),
        Linear("down", "feed_forward.w2", "rowwise", "mlp.down_proj", "ffn_down", lambda s: (s.dim, s.ffn_hidden_dim)),
    ),
    norms=(
        Norm("attention_norm", "input_layernorm", "attn_norm", lambda s: s.dim),
        Norm("attention.q_norm", "self_attn.q_norm", "attn_q_norm", lambda s: s.head_dim, "qk_norm"),
        Norm("attention.k_norm", "self_attn.k_norm", "attn_k_norm", lambda s: s.head_dim, "qk_norm"),
        Norm("ffn_norm", "post_attention_layernorm", "ffn_norm", lambda s: s.dim),
    ),
    top_hf={"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
            "output.weight": "lm_head.weight"},
    top_gguf={"tok_embeddings.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
              "output.weight": "output.weight"},
)
