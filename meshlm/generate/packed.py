"""The decoder's weights laid out for inference: two fp32 variants chosen by the batch, and an int8 one (decode.py).

Decoding multiplies one row (or a few) by every weight, so a step is ~200 matrix products whose cost is reading
the weights plus a fixed dispatch cost per op, and which BLAS path is fastest depends on the weight's layout and
on the number of rows. Measured on the 2-core EPYC development machine (fp32, one thread, CPU time; the command
and figures in docs/benchmarks.md, "Decoding"), for one row x (1, in):

- x @ W stored (in, out) beats ``F.linear`` on the (out, in) weight for q/k/v, o, gate/up and the head
  (gate/up 576 -> 3072: 0.23 vs 0.63 ms; the 49k-row head 9.1 vs 14.8 ms), and loses for the down projection;
- at 16 rows the (out, in) layout is as fast or faster for every matrix; and from 2 rows, computed with the
  operands swapped (``(W xᵀ)ᵀ`` on the (out, in) weight, decode.py ``_swapped``), it is 1.3–4× faster than either
  (session 10, two threads, weights streamed from memory as in a step).

So the **row pack** (a step of :data:`ROW_PACK_MAX_BATCH` row: a single stream's decode step) holds copies: q/k/v as
one (D, (H + 2 Hkv) Dh) matrix, gate/up as one (D, 2F), o and the head transposed and contiguous; the down
projection stays a view of the model's own weight. On a CPU with more than one core every row-pack matrix (the down
projection too) is a :class:`~meshlm.generate.split.SplitMatrix` instead: column blocks, one per core, multiplied in
one ``bmm``, because a one-row ``mm`` runs on one core whatever the thread count (meshlm/generate/split.py: the
step's products 24.6 → 13.2 ms on two cores). The **view pack** (more rows: batches, prefill) copies nothing: every
matrix is a transposed view of the model's parameter (q/k/v and gate/up as separate products). LoRA updates are
merged in (a new tensor either way).

A third variant, the **int8 pack** (``--weights int8``: decode steps of any batch), holds every matrix as an
:class:`~meshlm.generate.int8.Int8Matrix` — q/k/v fused (their bias folded in), o, gate/up fused, down, the head;
the **int4 pack** (``--weights int4``) the same matrices as :class:`~meshlm.generate.int4.Int4Matrix`.

Every pack also carries what the family's block needs beside its matrices (decode.py ``FastForward._block``):
norm weights (Gemma's (1 + w) held as 1 + w in fp32), Gemma 3's post-attention and post-MLP norms, each layer's
RoPE kind (sliding layers with a base of their own), the embedding scale, the scores' scale and the MLP's gate.

A pack is made once and reused while the model's parameters are unchanged: :func:`packed_weights` keeps one of
each variant per model and rebuilds it when any parameter was modified in place (an optimizer step bumps a
tensor's version counter) or replaced.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from meshlm.generate.int4 import Int4Matrix, int4_or_fp32
from meshlm.generate.int8 import Int8Matrix
from meshlm.generate.split import SplitMatrix, row_splits
from meshlm.models.families import supports_packed
from meshlm.models.head import OutputHead
from meshlm.models.llama import Transformer
from meshlm.models.lora import LoRALinear


ROW_PACK_MAX_BATCH = 1  # one-core CPU rows: from 2 rows the view pack, multiplied operands-swapped (decode.py
# _swapped), wins
VIEW_PACK_ROWS = (2, 4)  # CPU rows, more than one core: the view pack's rows (pack_variant); the blocks elsewhere
# Elsewhere (CUDA: not measured) the threshold the row pack had before the swapped products.
OTHER_DEVICE_ROW_PACK_MAX_BATCH = 4


@dataclass
class PackedLayer:
    """One block's weights. Matrices are (in, out) (copies or transposed views), or callables of the same shape
    (split.py's column blocks, int8.py's and int4.py's quantized matrices): x (N, in) @ w -> (N, out)."""

    attention_norm: torch.Tensor  # (D,)
    wqkv: list[torch.Tensor]  # [(D, (H + 2 Hkv) Dh)] or [(D, H Dh), (D, Hkv Dh), (D, Hkv Dh)]: q, k, v heads
    bqkv: torch.Tensor | None  # ((H + 2 Hkv) Dh,) Qwen2's q/k/v bias
    qk_norm: torch.Tensor | None  # (H + Hkv, Dh) Qwen3's per-head q norm weight (H rows), then k's (Hkv rows)
    wo: torch.Tensor  # (H Dh, D)
    ffn_norm: torch.Tensor  # (D,)
    w13: list[torch.Tensor]  # [(D, 2 F)] or [(D, F), (D, F)]: the gate (w1), then the up projection (w3)
    w2: torch.Tensor  # (F, D)
    window: int  # the layer's attention window, 0 for full causal attention
    rope: str  # "global" or "sliding": the RoPE tables the layer reads (Gemma 3's sliding layers: a base of their own)
    post_attention_norm: torch.Tensor | None  # (D,) Gemma's norm of the attention output before its residual add
    post_ffn_norm: torch.Tensor | None  # (D,) and of the MLP's


@dataclass
class PackedModel:
    embedding: torch.Tensor  # (V, D)
    layers: list[PackedLayer]
    norm: torch.Tensor  # (D,)
    head: torch.Tensor  # (D, V)
    norm_eps: float
    n_heads: int
    n_kv_heads: int
    head_dim: int
    norm_in_fp32: bool  # norm weights multiply in fp32 before the cast back (Gemma's (1 + w), held as 1 + w)
    embed_scale: torch.Tensor | None  # () sqrt(D) in the embedding's dtype (Gemma), or None
    attn_scale: float | None  # scores' scale (Gemma: query_pre_attn_scalar ** -0.5); None: 1 / sqrt(Dh)
    gelu: bool  # the MLP's gate: tanh-approximated GELU (GeGLU, Gemma), else SiLU (SwiGLU)


def _inner(module: nn.Module) -> nn.Module:
    """The module a wrapper holds: torch.compile's OptimizedModule, activation checkpointing's wrapper."""
    while True:
        for attr in ("_orig_mod", "_checkpoint_wrapped_module"):
            if hasattr(module, attr):
                module = getattr(module, attr)
                break
        else:
            return module


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the packed path cannot stand in for ``model``'s forward (None when it can): it needs a whole
    meshlm decoder on plain tensors (no tensor/FSDP sharding, no pipeline stage) with its vocabulary head."""
    model = _inner(model)
    if not isinstance(model, Transformer):
        return f"not a meshlm decoder ({type(model).__name__})"
    if not supports_packed(model.cfg):  # the family declares no packed block (meshlm/models/families/)
        return f"the {model.cfg.family} family has no packed block"
    if model.tok_embeddings is None or model.norm is None or not isinstance(model.output, OutputHead):
        return "a pipeline stage or a model without its vocabulary head"
    for name, p in model.named_parameters():
        if isinstance(p, DTensor):
            return f"parameter {name} is sharded (tensor parallelism or FSDP)"
        if p.device.type == "meta":
            return f"parameter {name} is on the meta device"
    for name, m in model.named_modules():
        if isinstance(m, LoRALinear) and m.lora_dropout is not None and m.training:
            return f"{name} applies LoRA dropout (training mode)"
    return None


def _weight(linear: nn.Module) -> torch.Tensor:
    """The effective (out, in) weight of a projection: LoRA's low-rank update merged in."""
    linear = _inner(linear)
    w = linear.weight.detach()
    if isinstance(linear, LoRALinear) and not linear.merged:
        w = w + linear.delta_weight().detach().to(w.dtype)
    return w


def _bias(linear: nn.Module) -> torch.Tensor | None:
    bias = _inner(linear).bias
    return None if bias is None else bias.detach()


def _matrices(weights: list[torch.Tensor], fuse: bool, splits: int = 1) -> list:
    """(out, in) weights -> (in, out) matrices: one contiguous concatenation (in ``splits`` column blocks when
    more than one), or transposed views."""
    if fuse and splits > 1:
        return [SplitMatrix(torch.cat(weights).t(), splits)]
    if fuse:
        return [torch.cat(weights).t().contiguous()]
    return [w.t() for w in weights]


def _norm(norm: nn.Module | None) -> torch.Tensor | None:
    """A norm's weight as the packed block multiplies it: the parameter itself, or Gemma's (1 + w) in fp32 (a new
    tensor; meshlm/models/llama.py RMSNorm)."""
    if norm is None:
        return None
    weight = norm.weight.detach()
    return 1.0 + weight.float() if norm.unit_offset else weight


def _pack_layer(block: nn.Module, window: int, rope: str, n_heads: int, n_kv_heads: int, variant: str,
                splits: int = 1) -> PackedLayer:
    block = _inner(block)
    attn, ffn = _inner(block.attention), _inner(block.feed_forward)
    biases = [_bias(attn.wq), _bias(attn.wk), _bias(attn.wv)]
    bqkv = torch.cat(biases) if biases[0] is not None else None
    qk_norm = None
    if attn.q_norm is not None:
        qk_norm = torch.cat([_norm(attn.q_norm).expand(n_heads, -1),
                             _norm(attn.k_norm).expand(n_kv_heads, -1)])  # (H + Hkv, Dh)
    qkv, gate_up = [_weight(attn.wq), _weight(attn.wk), _weight(attn.wv)], [_weight(ffn.w1), _weight(ffn.w3)]
    common = dict(attention_norm=_norm(block.attention_norm), qk_norm=qk_norm, ffn_norm=_norm(block.ffn_norm),
                  window=window, rope=rope, post_attention_norm=_norm(block.post_attention_norm),
                  post_ffn_norm=_norm(block.post_ffn_norm))
    if variant in QUANTIZED:  # fused q/k/v (bias folded in) and gate/up, each one quantized matrix
        quantized = QUANTIZED[variant]
        return PackedLayer(wqkv=[quantized(torch.cat(qkv), bqkv)], bqkv=None, wo=quantized(_weight(attn.wo)),
                           w13=[quantized(torch.cat(gate_up))], w2=quantized(_weight(ffn.w2)), **common)
    rows = variant == "rows"
    w2 = _matrices([_weight(ffn.w2)], True, splits)[0] if rows and splits > 1 else _weight(ffn.w2).t()
    return PackedLayer(wqkv=_matrices(qkv, rows, splits), bqkv=bqkv,
                       wo=_matrices([_weight(attn.wo)], rows, splits)[0], w13=_matrices(gate_up, rows, splits), w2=w2,
                       **common)


QUANTIZED = {"int8": Int8Matrix, "int4": int4_or_fp32}  # variant -> (out, in) weight, bias -> a callable matrix
PACK_VARIANTS = ("rows", "views", *QUANTIZED)


@torch.no_grad()
def pack(model: Transformer, variant: str) -> PackedModel:
    """``model``'s weights in the row pack, the view pack (see the module docstring) or as int8 or int4 matrices
    (meshlm/generate/int8.py, int4.py)."""
    if variant not in PACK_VARIANTS:
        raise ValueError(f"pack variant must be one of {PACK_VARIANTS}, got {variant!r}")
    model = _inner(model)
    cfg = model.cfg
    splits = row_splits(next(model.parameters()).device) if variant == "rows" else 1
    # the RoPE tables each layer reads: by its kind where sliding layers have a base of their own (Gemma 3), else
    # one set for all (a window alone, as Mistral's, keeps the global tables: one gather a step, not two)
    kinds = cfg.resolved_layer_kinds() if cfg.local_rope else ["global"] * cfg.n_layers
    layers = [_pack_layer(block, cfg.layer_window(int(name)), kinds[int(name)], cfg.n_heads, cfg.n_kv_heads, variant,
                          splits)
              for name, block in model.layers.items()]
    out = _weight(model.output)
    head = QUANTIZED[variant](out) if variant in QUANTIZED else _matrices([out], variant == "rows", splits)[0]
    embedding = model.tok_embeddings.weight.detach()
    return PackedModel(embedding=embedding, layers=layers, norm=_norm(model.norm), head=head,
                       norm_eps=cfg.norm_eps, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                       head_dim=cfg.resolved_head_dim, norm_in_fp32=cfg.norm_unit_offset,
                       embed_scale=torch.tensor(cfg.dim ** 0.5, dtype=embedding.dtype) if cfg.scale_embeddings
                       else None,  # sqrt(D) rounded to the weights' dtype, as the plain forward
                       attn_scale=cfg.query_pre_attn_scalar ** -0.5 if cfg.query_pre_attn_scalar else None,
                       gelu=cfg.mlp_activation == "gelu_tanh")


def _state_key(model: nn.Module) -> tuple:
    """What a pack depends on: each parameter's identity, storage and version counter."""
    key = []
    for p in model.parameters():
        try:
            version = p._version
        except RuntimeError:  # an inference-mode tensor keeps no version counter (and cannot be updated later)
            version = -1
        key.append((id(p), p.data_ptr(), version))
    return tuple(key)


_PACKS: "weakref.WeakKeyDictionary[nn.Module, dict[str, tuple[tuple, PackedModel]]]" = weakref.WeakKeyDictionary()


def pack_variant(model: nn.Module, batch: int, weights: str = "fp32", copies: bool = True) -> str:
    """The pack a forward of ``batch`` rows (batch x new tokens) multiplies: the row or the view pack by the rows
    (fp32), the int8 or int4 pack for every batch. ``copies=False``: the view pack for any fp32 rows (an int8 or
    int4 model's prefill: no fp32 copy beside its quantized one).

    On a CPU whose row pack is in column blocks (more than one core, split.py) the blocks win at every row count
    but :data:`VIEW_PACK_ROWS`, where the view pack's operand-swapped products do (SmolLM2-135M, two threads,
    quiet, ms a decode step blocks / views: 1 row 17.4 / –, 2 rows 25.2 / 18.6, 4 rows 28.5 / 21.7, 6 rows 32.5 /
    33.2, 8 rows 34.7 / 37.7, 16 rows 48.9 / 70.2, 64 rows 127 / 151; one-sequence prefills of 16 / 128 / 512
    tokens 39 / 166 / 643 against 60 / 192 / 665 ms; docs/benchmarks.md "Decoding on every core")."""
    if weights in QUANTIZED:
        return weights
    device = next(model.parameters()).device
    if device.type != "cpu":
        return "rows" if copies and batch <= OTHER_DEVICE_ROW_PACK_MAX_BATCH else "views"
    if not copies or (batch > ROW_PACK_MAX_BATCH and row_splits(device) == 1):
        return "views"
    return "views" if VIEW_PACK_ROWS[0] <= batch <= VIEW_PACK_ROWS[1] else "rows"


def packed_weights(model: Transformer, batch: int, weights: str = "fp32", copies: bool = True) -> PackedModel:
    """The pack for ``batch`` rows of ``model``'s current weights in format ``weights`` (:func:`pack_variant`):
    the one made earlier when no parameter changed since, else new."""
    model = _inner(model)
    variant = pack_variant(model, batch, weights, copies)
    key = _state_key(model)
    packs = _PACKS.setdefault(model, {})
    hit = packs.get(variant)
    if hit is not None and hit[0] == key:
        return hit[1]
    packs.pop(variant, None)  # free the stale copy before making the new one
    packed = pack(model, variant)
    packs[variant] = (key, packed)
    return packed


def pack_bytes(packed: PackedModel, model: nn.Module) -> int:
    """Memory a pack holds beyond ``model``'s own parameters: its copies (fused, transposed-contiguous, LoRA-merged
    matrices; an int8 matrix as one byte an entry plus an fp32 scale a row and its bias); views of a parameter
    cost nothing."""
    own = {p.untyped_storage().data_ptr() for p in _inner(model).parameters()}
    tensors: list = [packed.embedding, packed.norm, packed.head]
    for layer in packed.layers:
        tensors += [layer.attention_norm, *layer.wqkv, layer.bqkv, layer.qk_norm, layer.wo, layer.ffn_norm,
                    *layer.w13, layer.w2, layer.post_attention_norm, layer.post_ffn_norm]
    total = 0
    for t in tensors:
        if isinstance(t, Int8Matrix):
            rows, cols = t.shape[1], t.shape[0]  # (out, in) of an (in, out)-shaped matrix
            total += rows * cols + 4 * rows + (0 if t.bias is None else 4 * t.bias.numel())
        elif isinstance(t, (Int4Matrix, SplitMatrix)):
            total += t.nbytes()
        elif isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in own:  # int4's fp32 fallback: a view
            total += t.numel() * t.element_size()
    return total
