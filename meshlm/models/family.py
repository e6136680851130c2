"""The model family spec: what a family declares, so generic code never names a family's modules itself.

meshlm has one generic decoder (meshlm/models/llama.py) whose block takes flags (a window, q/k/v biases, q/k
norms, (1 + w) norms, norms after attention and the MLP, GeGLU, scaled embeddings). A family
(meshlm/models/families/<name>.py) is a :class:`FamilySpec`: its module names, its Hugging Face and llama.cpp
names and config mappers, its tokenizer kind and whether the packed decode block serves it. Each projection and
norm is declared once, with

- its tensor-parallel style (column- or row-parallel; distributed/tensor_parallel.py builds the plan from it),
- its Hugging Face and llama.cpp (GGUF) names (interop/hf.py, interop/peft.py, interop/gguf_names.py),
- its LoRA target name (``lora.targets``; models/lora.py) and
- its weight shape from a config (planner/model_spec.py counts parameters from it; models/lora.py too).

Readers take the spec from the model's config (``meshlm.models.families.spec_of(cfg)``). ``DECODER`` is the llama
family's spec, kept for readers that count the llama block (the planner). Torch-free: the planner and the config
layer import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Literal

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
    hf_architectures: tuple[str, ...] = ()  # config.json "architectures" this family reads
    hf_model_types: tuple[str, ...] = ()  # ... and "model_type"
    # (parsed config.json, its path) -> (ModelConfig, notes for the user); refuses what meshlm cannot run exactly.
    hf_config_in: Callable[..., Any] | None = None
    # Where a multimodal checkpoint keeps the language model's "model." tensors instead, and the prefixes of the
    # other towers' tensors, which import leaves out (Gemma3ForConditionalGeneration).
    hf_text_prefixes: tuple[str, ...] = ()
    hf_skip_prefixes: tuple[str, ...] = ()
    # (ModelConfig, bos_id, eos_ids, pad_id, dtype) -> config.json fields
    hf_config_out: Callable[..., dict[str, Any]] | None = None
    gguf_architectures: tuple[str, ...] = ()  # llama.cpp general.architecture values this family reads
    gguf_interleaved_qk: tuple[str, ...] = ()  # of those, the ones whose q/k rows llama.cpp reorders
    gguf_norm_offset: float = 0.0  # what llama.cpp's converter adds to every norm weight (Gemma: 1.0)
    # (GGUF metadata dict, architecture) -> the ModelConfig fields this family sets beyond the common shape keys
    gguf_config_in: Callable[[dict[str, Any], str], dict[str, Any]] | None = None
    tokenizer: str = "bpe"  # "bpe" (byte-level BPE, HF tokenizer.json) or "sentencepiece" (Gemma)
    # The family's turn format (Jinja), written by ``convert from-gguf`` when the file has no template and its
    # vocabulary holds every token the format names (a base model's GGUF: Gemma's "<start_of_turn>" turns).
    chat_template: str = ""
    chat_tokens: tuple[str, ...] = ()  # the special tokens chat_template writes
    packed_decode: bool = False  # the packed decode block (meshlm/generate/packed.py) computes this family's block
    flags: dict[str, Any] | None = None  # the ModelConfig flags every model of the family has (checked on load)

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


# The generic block's projections (meshlm/models/llama.py), with the names Hugging Face and llama.cpp give them in
# every family meshlm reads so far; a family with other names declares its own.
LINEARS = (
    Linear("q", "attention.wq", "colwise", "self_attn.q_proj", "attn_q", lambda s: (s.q_size, s.dim), "qkv_bias"),
    Linear("k", "attention.wk", "colwise", "self_attn.k_proj", "attn_k", lambda s: (s.kv_size, s.dim), "qkv_bias"),
    Linear("v", "attention.wv", "colwise", "self_attn.v_proj", "attn_v", lambda s: (s.kv_size, s.dim), "qkv_bias"),
    Linear("o", "attention.wo", "rowwise", "self_attn.o_proj", "attn_output", lambda s: (s.dim, s.q_size)),
    Linear("gate", "feed_forward.w1", "colwise", "mlp.gate_proj", "ffn_gate", _ffn),
    Linear("up", "feed_forward.w3", "colwise", "mlp.up_proj", "ffn_up", _ffn),
    Linear("down", "feed_forward.w2", "rowwise", "mlp.down_proj", "ffn_down", lambda s: (s.dim, s.ffn_hidden_dim)),
)
QK_NORMS = (
    Norm("attention.q_norm", "self_attn.q_norm", "attn_q_norm", lambda s: s.head_dim, "qk_norm"),
    Norm("attention.k_norm", "self_attn.k_norm", "attn_k_norm", lambda s: s.head_dim, "qk_norm"),
)
TOP_HF = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
          "output.weight": "lm_head.weight"}
TOP_GGUF = {"tok_embeddings.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
            "output.weight": "output.weight"}


def __getattr__(name: str) -> Any:
    # DECODER: the llama family's spec, defined in its own module (imported lazily: it imports this one).
    if name == "DECODER":
        from meshlm.models.families.llama import SPEC

        return SPEC
    raise AttributeError(f"module 'meshlm.models.family' has no attribute {name!r}")
