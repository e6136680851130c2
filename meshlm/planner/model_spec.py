"""The planner's view of a model: shapes only, for meshlm's decoders and GPT-style ones.

Llama-style is meshlm's own block (RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases unless
``qkv_bias``); GPT-style is the Megatron/GPT-2 block (LayerNorm with bias, multi-head attention, a 4h GELU MLP
with biases, learned positions). GPT-style exists only in the planner (meshlm trains Llama-style models), so
published GPT results (Megatron, ZeRO) can be checked.

A model comes from a meshlm flavour name, a planner preset (``gpt-*``), a meshlm TOML job config or an HF
``config.json``. Its tensors and its parameter and FLOP counts come from meshlm/models/counts.py.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from meshlm.config.loader import load_config
from meshlm.errors import ConfigError
from meshlm.models import counts
from meshlm.models.counts import ModelShape, Tensor
from meshlm.models.family import Shapes
from meshlm.models.flavors import FLAVORS, flavor_config
from meshlm.sections import did_you_mean


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
    family: str = "llama"  # the model family (meshlm/models/families) whose declared tensors are counted
    flags: frozenset[str] = frozenset()  # the family's config flags that are on, beyond qkv_bias / qk_norm
    windows: tuple[int, ...] = ()  # attention window per layer (0: full attention); empty: every layer full

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

    def count_shape(self) -> ModelShape:
        """The shape meshlm/models/counts.py counts parameters and FLOPs from."""
        cached = self.__dict__.get("_count_shape")
        if cached is None:
            flags = self.flags | {name for name in ("qkv_bias", "qk_norm") if getattr(self, name)}
            cached = ModelShape("gpt" if self.arch == "gpt" else self.family, self.dim, self.n_layers, self.n_heads,
                                self.n_kv_heads, self.hd, self.ffn_hidden_dim, self.vocab_size, self.tie_embeddings,
                                frozenset(flags), self.windows, self.max_seq_len if self.arch == "gpt" else 0)
            self.__dict__["_count_shape"] = cached  # frozen dataclass: cache through __dict__
        return cached

    def block_tensors(self) -> tuple[Tensor, ...]:
        """One transformer block's parameters, in the engine's module order (FSDP unit = one block)."""
        cached = self.__dict__.get("_block_tensors")
        if cached is None:
            cached = counts.block_tensors(self.count_shape())
            self.__dict__["_block_tensors"] = cached
        return cached

    def shapes(self) -> Shapes:
        """The sizes the family spec's tensor shapes are made of."""
        return self.count_shape().shapes

    def embedding_tensors(self) -> list[Tensor]:
        """Parameters of the first pipeline stage outside the blocks."""
        return list(counts.embedding_tensors(self.count_shape()))

    def head_tensors(self) -> list[Tensor]:
        """Parameters of the last pipeline stage outside the blocks (final norm, untied output head)."""
        return list(counts.head_tensors(self.count_shape()))

    def num_params(self) -> int:
        return counts.num_params(self.count_shape())

    def matmul_params(self) -> int:
        """Weights multiplied per token (blocks + output head, tied or not): 2 FLOPs each forward."""
        return counts.matmul_params(self.count_shape())

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

def from_model_config(cfg, name: str | None = None) -> ModelSpec:
    """From a meshlm :class:`~meshlm.models.config.ModelConfig` (any registered family)."""
    model_keys = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    shape = counts.shape_of(cfg)
    return ModelSpec(name or cfg.flavor, "llama", cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
                     cfg.ffn_hidden_dim, cfg.vocab_size, cfg.max_seq_len, cfg.head_dim, cfg.qkv_bias, cfg.qk_norm,
                     cfg.tie_embeddings, meshlm_model=model_keys, family=shape.family, flags=shape.flags,
                     windows=shape.windows)


def from_hf_config(path: Path) -> ModelSpec:
    """From an HF ``config.json``: what meshlm converts (read by meshlm/interop/hf_config.py, which refuses what
    the converter refuses), or GPT-2-like (``n_embd``), which exists only in the planner."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--model {path}: cannot read an HF config.json ({exc})") from None
    name = Path(path).parent.name or Path(path).stem
    if isinstance(raw, dict) and "n_embd" in raw:  # GPT-2 family
        try:
            h = int(raw["n_embd"])
            return ModelSpec(name, "gpt", h, int(raw["n_layer"]), int(raw["n_head"]), int(raw["n_head"]),
                             int(raw.get("n_inner") or 4 * h), int(raw["vocab_size"]),
                             int(raw.get("n_positions", 1024)),
                             tie_embeddings=bool(raw.get("tie_word_embeddings", True)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"--model {path}: not a GPT-2-style HF config (missing or bad {exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--model {path}: an HF config.json holds a JSON object")
    from meshlm.interop.hf_config import model_config_from_hf

    cfg, _ = model_config_from_hf(raw, Path(path))
    return from_model_config(cfg, name)


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
