"""Parameter and FLOP counts of a decoder, from a small shape description — the one place they are computed.

``ModelConfig.num_params`` (models/config.py), the planner's ``ModelSpec`` (planner/model_spec.py, which also
shards these tensors for memory), its step time (planner/timing.py) and the training MFU (train/flops.py) all
count through this module. A block's tensors come from its family spec's declared shapes
(``FamilySpec.linears`` / ``norms``, meshlm/models/family.py): a norm or bias exists when the config flag it
names is on, so a family's extra norms (Gemma 3's four per block, q/k norms) and its MLP (GeGLU has SwiGLU's
three matrices) are counted as declared. GPT-style blocks (LayerNorm with bias, fused qkv, a 4h GELU MLP with
biases, learned positions) exist only in the planner, to check published GPT results; they are declared here.

FLOPs (Kaplan et al. 2020; PaLM appendix B): 2 per matmul weight per token forward, 6 trained (forward, input
gradient, weight gradient); the head multiplies by its matrix tied or not. Attention's scores and values cost
4·q_size FLOPs per query and attended key forward, where a query attends ``seq_len`` keys on a full-attention
layer (the causal mask is not discounted, as Megatron and PaLM count) and ``min(window, seq_len)`` on a
sliding-window layer. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from meshlm.models.family import Shapes


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


@dataclass(frozen=True)
class ModelShape:
    """What the counts depend on. ``family``: a registered model family (meshlm/models/families) or ``gpt``
    (planner only); ``flags``: the config flags that are on (``qkv_bias``, ``qk_norm``, a family's own);
    ``windows``: the attention window of each layer (0: full attention; empty: every layer full);
    ``positions``: rows of a learned position table (GPT-style)."""

    family: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_hidden_dim: int
    vocab_size: int
    tie_embeddings: bool = False
    flags: frozenset[str] = frozenset()
    windows: tuple[int, ...] = ()
    positions: int = 0

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def shapes(self) -> Shapes:
        return Shapes(self.dim, self.q_size, self.n_kv_heads * self.head_dim, self.head_dim, self.ffn_hidden_dim)


def shape_of(cfg: Any) -> ModelShape:
    """The shape of a :class:`~meshlm.models.config.ModelConfig` (its family, flags and per-layer windows)."""
    family = getattr(cfg, "family", "llama")
    spec = _family(family)
    names = {n.flag for n in spec.norms} | {lin.bias_flag for lin in spec.linears}
    flags = frozenset(name for name in names if name and getattr(cfg, name, False))
    windows = tuple(cfg.layer_window(i) for i in range(cfg.n_layers))
    return ModelShape(family, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim,
                      cfg.ffn_hidden_dim, cfg.vocab_size, cfg.tie_embeddings, flags,
                      windows if any(windows) else ())


def _family(name: str):
    from meshlm.models.families import family_spec

    return family_spec(name)


# ------------------------------------------------------------------------------------------------ tensors
def block_tensors(shape: ModelShape) -> tuple[Tensor, ...]:
    """One block's parameters, in the engine's module order (norms, then projections)."""
    if shape.family == "gpt":
        return _gpt_block(shape)
    spec, shapes = _family(shape.family), shape.shapes
    on = shape.flags | {""}
    out = [Tensor(f"{norm.module}.weight", (norm.size(shapes),), None, False) for norm in spec.norms if norm.flag in on]
    for lin in spec.linears:
        out_features, in_features = lin.shape(shapes)
        out.append(Tensor(f"{lin.module}.weight", (out_features, in_features),
                          {"colwise": 0, "rowwise": 1}.get(lin.parallel), True))
        if lin.bias_flag and lin.bias_flag in shape.flags:
            out.append(Tensor(f"{lin.module}.bias", (out_features,), 0 if lin.parallel == "colwise" else None, False))
    return tuple(out)


def _gpt_block(shape: ModelShape) -> tuple[Tensor, ...]:
    """Megatron's block: fused qkv column-parallel; the biases of row-parallel layers replicated."""
    h, q, f = shape.dim, shape.q_size, shape.ffn_hidden_dim
    return (Tensor("ln_1.weight", (h,), None, False), Tensor("ln_1.bias", (h,), None, False),
            Tensor("attn.qkv.weight", (3 * q, h), 0, True), Tensor("attn.qkv.bias", (3 * q,), 0, False),
            Tensor("attn.proj.weight", (h, q), 1, True), Tensor("attn.proj.bias", (h,), None, False),
            Tensor("ln_2.weight", (h,), None, False), Tensor("ln_2.bias", (h,), None, False),
            Tensor("mlp.fc.weight", (f, h), 0, True), Tensor("mlp.fc.bias", (f,), 0, False),
            Tensor("mlp.proj.weight", (h, f), 1, True), Tensor("mlp.proj.bias", (h,), None, False))


def embedding_tensors(shape: ModelShape) -> tuple[Tensor, ...]:
    """Parameters before the blocks: the token embedding (and a learned position table)."""
    out = [Tensor("tok_embeddings.weight", (shape.vocab_size, shape.dim), 0, False)]
    if shape.positions:
        out.append(Tensor("pos_embeddings.weight", (shape.positions, shape.dim), None, False))
    return tuple(out)


def head_tensors(shape: ModelShape) -> tuple[Tensor, ...]:
    """Parameters after the blocks: the final norm (with a bias GPT-style) and an untied output head."""
    out = [Tensor("norm.weight", (shape.dim,), None, False)]
    if shape.family == "gpt":
        out.append(Tensor("norm.bias", (shape.dim,), None, False))
    if not shape.tie_embeddings:
        out.append(Tensor("output.weight", (shape.vocab_size, shape.dim), 0, True))
    return tuple(out)


def _numel(tensors: Iterable[Tensor], matmul_only: bool = False) -> int:
    return sum(t.numel for t in tensors if t.matmul or not matmul_only)


# ------------------------------------------------------------------------------------------------- counts
def num_params(shape: ModelShape, include_embedding: bool = True) -> int:
    """Unique parameters (a tied head counts once, as the embedding); without the embedding tables if asked."""
    outside = _numel(head_tensors(shape)) + (_numel(embedding_tensors(shape)) if include_embedding else 0)
    return shape.n_layers * _numel(block_tensors(shape)) + outside


def block_matmul_params(shape: ModelShape) -> int:
    """Weights one block multiplies per token."""
    return _numel(block_tensors(shape), matmul_only=True)


def head_matmul_params(shape: ModelShape) -> int:
    """Weights the output head multiplies per token (the embedding's, when tied)."""
    return shape.vocab_size * shape.dim


def matmul_params(shape: ModelShape) -> int:
    """Weights multiplied per token: every block's and the output head's (tied or not)."""
    return shape.n_layers * block_matmul_params(shape) + head_matmul_params(shape)


def attention_context(shape: ModelShape, seq_len: int, layers: Iterable[int] | None = None) -> int:
    """Keys the queries of one position attend, summed over ``layers`` (default: all): ``seq_len`` on a layer
    of full attention, ``min(window, seq_len)`` on a sliding-window layer."""
    indices = range(shape.n_layers) if layers is None else layers
    return sum(min(shape.windows[i], seq_len) if shape.windows and shape.windows[i] else seq_len for i in indices)


def attention_flops_per_token(shape: ModelShape, seq_len: int, layers: Iterable[int] | None = None) -> float:
    """Forward FLOPs of attention's scores and values per token over ``layers`` (default: all)."""
    return 4.0 * shape.q_size * attention_context(shape, seq_len, layers)


def model_flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward, recompute not counted): 6 per matmul weight plus three
    times attention's forward."""
    return 6.0 * matmul_params(shape) + 3.0 * attention_flops_per_token(shape, seq_len)
