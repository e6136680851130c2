"""The planner's view of a model: shapes only, for Llama-style and GPT-style decoders.

Llama-style is meshlm's own block (RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases unless
``qkv_bias``); GPT-style is the Megatron/GPT-2 block (LayerNorm with bias, multi-head attention, a 4h GELU MLP
with biases, learned positions). GPT-style exists only in the planner (meshlm trains Llama-style models), so
published GPT results (Megatron, ZeRO) can be checked.

A model comes from a meshlm flavour name, a planner preset (``gpt-*``), a meshlm TOML job config or an HF
``config.json``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from meshlm.config.loader import load_config
from meshlm.errors import ConfigError
from meshlm.models.family import DECODER, Shapes
from meshlm.models.flavors import FLAVORS, flavor_config
from meshlm.sections import did_you_mean


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor: its global shape and the dim tensor parallelism shards (None: replicated)."""

    name: str
    shape: tuple[int, ...]
    tp_dim: int | None
    matmul: bool  # a weight multiplied by activations (counted in FLOPs; cast by autocast)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, eq=False)  # identity-hashed: the planner caches per-model results
class ModelSpec:
    name: str
    arch: str  # "llama" or "gpt"
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden_dim: int
    vocab_size: int
    max_seq_len: int = 4096
    head_dim: int = 0
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    flash_attention: bool = True  # False: attention scores are materialised (memory and traffic O(s²))
    meshlm_model: dict | None = None  # [model] keys when the model is trainable by meshlm

    def __post_init__(self) -> None:
        for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden_dim", "vocab_size", "max_seq_len"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"model '{self.name}': {key} must be positive, got {getattr(self, key)}")
        if self.arch not in ("llama", "gpt"):
            raise ConfigError(f"model '{self.name}': arch must be 'llama' or 'gpt', got '{self.arch}'")
        if self.head_dim == 0 and self.dim % self.n_heads:
            raise ConfigError(f"model '{self.name}': dim ({self.dim}) is not divisible by n_heads "
                              f"({self.n_heads}); change one of them or give head_dim")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model '{self.name}': n_heads ({self.n_heads}) is not a multiple of n_kv_heads "
                              f"({self.n_kv_heads})")

    # ------------------------------------------------------------------------------------------ shapes
    @property
    def hd(self) -> int:
        return self.head_dim or self.dim // self.n_heads

    @property
    def q_size(self) -> int:
        return self.n_heads * self.hd

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.hd

    def block_tensors(self) -> tuple[Tensor, ...]:
        """One transformer block's parameters, in the engine's module order (FSDP unit = one block)."""
        cached = self.__dict__.get("_block_tensors")
        if cached is None:
            cached = tuple(self._block_tensors())
            self.__dict__["_block_tensors"] = cached  # frozen dataclass: cache through __dict__
        return cached

    def _block_tensors(self) -> list[Tensor]:
        h, q, f = self.dim, self.q_size, self.ffn_hidden_dim
        if self.arch == "gpt":  # Megatron: fused qkv column-parallel, biases of row-parallel layers replicated
            return [Tensor("ln_1.weight", (h,), None, False), Tensor("ln_1.bias", (h,), None, False),
                    Tensor("attn.qkv.weight", (3 * q, h), 0, True), Tensor("attn.qkv.bias", (3 * q,), 0, False),
                    Tensor("attn.proj.weight", (h, q), 1, True), Tensor("attn.proj.bias", (h,), None, False),
                    Tensor("ln_2.weight", (h,), None, False), Tensor("ln_2.bias", (h,), None, False),
                    Tensor("mlp.fc.weight", (f, h), 0, True), Tensor("mlp.fc.bias", (f,), 0, False),
                    Tensor("mlp.proj.weight", (h, f), 1, True), Tensor("mlp.proj.bias", (h,), None, False)]
        return list(self._decoder_tensors())

    def shapes(self) -> Shapes:
        """The sizes the family spec's tensor shapes are made of."""
        return Shapes(self.dim, self.q_size, self.kv_size, self.hd, self.ffn_hidden_dim)

    def _decoder_tensors(self):
        """The block of meshlm's decoder, from its family spec (meshlm/models/family.py)."""
        shapes = self.shapes()
        flags = {"": True, "qkv_bias": self.qkv_bias, "qk_norm": self.qk_norm}
        for norm in DECODER.norms:
            if flags[norm.flag]:
                yield Tensor(f"{norm.module}.weight", (norm.size(shapes),), None, False)
        for lin in DECODER.linears:
            out_features, in_features = lin.shape(shapes)
            tp_dim = {"colwise": 0, "rowwise": 1}.get(lin.parallel)
            yield Tensor(f"{lin.module}.weight", (out_features, in_features), tp_dim, True)
            if lin.bias_flag and flags[lin.bias_flag]:
                yield Tensor(f"{lin.module}.bias", (out_features,), 0 if lin.parallel == "colwise" else None, False)

    def embedding_tensors(self) -> list[Tensor]:
        """Parameters of the first pipeline stage outside the blocks."""
        out = [Tensor("tok_embeddings.weight", (self.vocab_size, self.dim), 0, False)]
        if self.arch == "gpt":
            out.append(Tensor("pos_embeddings.weight", (self.max_seq_len, self.dim), None, False))
        return out

    def head_tensors(self) -> list[Tensor]:
        """Parameters of the last pipeline stage outside the blocks (final norm, untied output head)."""
        out = [Tensor("norm.weight", (self.dim,), None, False)]
        if self.arch == "gpt":
            out.append(Tensor("norm.bias", (self.dim,), None, False))
        if not self.tie_embeddings:
            out.append(Tensor("output.weight", (self.vocab_size, self.dim), 0, True))
        return out

    def num_params(self) -> int:
        block = sum(t.numel for t in self.block_tensors())
        return self.n_layers * block + sum(t.numel for t in self.embedding_tensors() + self.head_tensors())

    def matmul_params(self) -> int:
        """Weights multiplied per token (blocks + output head, tied or not): 2 FLOPs each forward."""
        block = sum(t.numel for t in self.block_tensors() if t.matmul)
        return self.n_layers * block + self.vocab_size * self.dim

    def describe(self) -> str:
        kind = "Llama-style" if self.arch == "llama" else "GPT-style"
        return (f"{self.name} ({kind}): {self.num_params() / 1e9:.2f}B params, {self.n_layers} layers, dim "
                f"{self.dim}, {self.n_heads} heads ({self.n_kv_heads} kv), ffn {self.ffn_hidden_dim}, "
                f"vocab {self.vocab_size}")


# ------------------------------------------------------------------------------------------------ presets
def gpt(name: str, dim: int, n_layers: int, n_heads: int, vocab: int = 51200, seq: int = 2048) -> ModelSpec:
    # Megatron (2021) ties the output head to the word embedding, and fused the softmax but materialised the
    # scores (no flash attention).
    return ModelSpec(name, "gpt", dim, n_layers, n_heads, n_heads, 4 * dim, vocab, max_seq_len=seq,
                     tie_embeddings=True, flash_attention=False)


# GPT-style shapes: Megatron (Narayanan et al. 2021, Table 1: vocabulary 51200, sequence 2048) and the ZeRO
# paper's 7.5B, plus a 30B for the worked examples (docs/planner.md).
GPT_PRESETS: dict[str, ModelSpec] = {
    "gpt-1.7b": gpt("gpt-1.7b", 2304, 24, 24),
    "gpt-3.6b": gpt("gpt-3.6b", 3072, 30, 32),
    "gpt-7.5b": gpt("gpt-7.5b", 4096, 36, 32),
    "gpt-18b": gpt("gpt-18b", 6144, 40, 48),
    "gpt-30b": gpt("gpt-30b", 7168, 48, 56),
    "gpt-39b": gpt("gpt-39b", 8192, 48, 64),
    "gpt-76b": gpt("gpt-76b", 10240, 60, 80),
    "gpt-145b": gpt("gpt-145b", 12288, 80, 96),
    "gpt-310b": gpt("gpt-310b", 16384, 96, 128),
    "gpt-530b": gpt("gpt-530b", 20480, 105, 128),
    "gpt-1t": gpt("gpt-1t", 25600, 128, 160),
}

_MODEL_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden_dim", "vocab_size",
               "max_seq_len", "qkv_bias", "qk_norm", "tie_embeddings")


def from_model_config(cfg, name: str | None = None) -> ModelSpec:
    """From a meshlm :class:`~meshlm.models.config.ModelConfig`."""
    model_keys = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    return ModelSpec(name or cfg.flavor, "llama", cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
                     cfg.ffn_hidden_dim, cfg.vocab_size, cfg.max_seq_len, cfg.head_dim, cfg.qkv_bias, cfg.qk_norm,
                     cfg.tie_embeddings, meshlm_model=model_keys)


def from_hf_config(path: Path) -> ModelSpec:
    """From an HF ``config.json``: Llama/Mistral/Qwen2-like (``intermediate_size``) or GPT-2-like (``n_embd``)."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--model {path}: cannot read an HF config.json ({exc})") from None
    name = Path(path).parent.name or Path(path).stem
    try:
        if "n_embd" in raw:  # GPT-2 family
            h = int(raw["n_embd"])
            return ModelSpec(name, "gpt", h, int(raw["n_layer"]), int(raw["n_head"]), int(raw["n_head"]),
                             int(raw.get("n_inner") or 4 * h), int(raw["vocab_size"]),
                             int(raw.get("n_positions", 1024)),
                             tie_embeddings=bool(raw.get("tie_word_embeddings", True)))
        heads = int(raw["num_attention_heads"])
        model = dict(dim=int(raw["hidden_size"]), n_layers=int(raw["num_hidden_layers"]), n_heads=heads,
                     n_kv_heads=int(raw.get("num_key_value_heads") or heads),
                     head_dim=int(raw.get("head_dim") or 0), ffn_hidden_dim=int(raw["intermediate_size"]),
                     vocab_size=int(raw["vocab_size"]), max_seq_len=int(raw.get("max_position_embeddings", 4096)),
                     qkv_bias=bool(raw.get("attention_bias", raw.get("model_type") == "qwen2")),
                     qk_norm=raw.get("model_type") == "qwen3",
                     tie_embeddings=bool(raw.get("tie_word_embeddings", False)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"--model {path}: not a Llama- or GPT-style HF config (missing or bad {exc})") from None
    if model["head_dim"] == model["dim"] // heads:
        model["head_dim"] = 0
    return ModelSpec(name, "llama", **model, meshlm_model={"flavor": "debug", **model})


def from_toml(path: Path) -> ModelSpec:
    return from_model_config(load_config(path).model, Path(path).stem)


def resolve_model(text: str) -> ModelSpec:
    """A flavour name, a ``gpt-*`` preset, a meshlm ``.toml`` job config or an HF ``config.json``."""
    if text in FLAVORS:
        spec = from_model_config(flavor_config(text))
        return dataclasses.replace(spec, meshlm_model={"flavor": text})
    if text in GPT_PRESETS:
        return GPT_PRESETS[text]
    path = Path(text)
    if path.suffix == ".toml":
        if not path.is_file():
            raise ConfigError(f"--model {text}: no such TOML config")
        return from_toml(path)
    if path.suffix == ".json" or path.is_dir():
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise ConfigError(f"--model {text}: no such config.json")
        return from_hf_config(path)
    known = [*FLAVORS, *GPT_PRESETS]
    raise ConfigError(f"--model: unknown model '{text}'{did_you_mean(text, known)}; give a flavour "
                      f"({', '.join(FLAVORS)}), a GPT preset ({', '.join(GPT_PRESETS)}), a .toml job config or "
                      "an HF config.json")
