"""The decoder's weights repacked for inference: q/k/v as one matrix, w1/w3 as one, each stored (in, out).

Why: decoding a token multiplies one row (or a few) by every weight, so a step is ~200 matrix-vector products
whose cost is reading the weights plus a fixed dispatch cost per op. Concatenating q/k/v and gate/up halves the
number of those products, and storing each matrix (in, out), contiguous, lets the BLAS stream it row by row:
on the 2-core EPYC development machine a (1, 576) × (576, 3072) product runs ~2.5× faster than ``F.linear`` on the
(3072, 576) weight, and the 49k-row head ~1.6× (docs/benchmarks.md, "Decoding"). LoRA updates are merged in.

The pack is a copy (the model keeps its own parameters for training), made once and reused while the model's
parameters are unchanged: :func:`packed_weights` keeps one pack per model and rebuilds it when any parameter was
modified in place (an optimizer step bumps a tensor's version counter) or replaced.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from meshlm.models.head import OutputHead
from meshlm.models.llama import Transformer
from meshlm.models.lora import LoRALinear


@dataclass
class PackedLayer:
    """One block's weights. Matrices are (in, out): x (N, in) @ w -> (N, out)."""

    attention_norm: torch.Tensor  # (D,)
    wqkv: torch.Tensor  # (D, (H + 2 Hkv) Dh): q heads, then k heads, then v heads
    bqkv: torch.Tensor | None  # ((H + 2 Hkv) Dh,) Qwen2's q/k/v bias
    qk_norm: torch.Tensor | None  # (H + Hkv, Dh) Qwen3's per-head q norm weight (H rows), then k's (Hkv rows)
    wo: torch.Tensor  # (H Dh, D)
    ffn_norm: torch.Tensor  # (D,)
    w13: torch.Tensor  # (D, 2 F): the gate (w1), then the up projection (w3)
    w2: torch.Tensor  # (F, D)
    window: int  # the layer's attention window, 0 for full causal attention


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


def _pack_layer(block: nn.Module, window: int, n_heads: int, n_kv_heads: int) -> PackedLayer:
    block = _inner(block)
    attn, ffn = _inner(block.attention), _inner(block.feed_forward)
    biases = [_bias(attn.wq), _bias(attn.wk), _bias(attn.wv)]
    qk_norm = None
    if attn.q_norm is not None:
        qk_norm = torch.cat([attn.q_norm.weight.detach().expand(n_heads, -1),
                             attn.k_norm.weight.detach().expand(n_kv_heads, -1)])  # (H + Hkv, Dh)
    return PackedLayer(
        attention_norm=block.attention_norm.weight.detach().clone(),
        wqkv=torch.cat([_weight(attn.wq), _weight(attn.wk), _weight(attn.wv)]).t().contiguous(),
        bqkv=torch.cat(biases) if biases[0] is not None else None,
        qk_norm=qk_norm,
        wo=_weight(attn.wo).t().contiguous(),
        ffn_norm=block.ffn_norm.weight.detach().clone(),
        w13=torch.cat([_weight(ffn.w1), _weight(ffn.w3)]).t().contiguous(),
        w2=_weight(ffn.w2).t().contiguous(),
        window=window)


@torch.no_grad()
def pack(model: Transformer) -> PackedModel:
    """Copy ``model``'s weights into the inference layout (see the module docstring)."""
    model = _inner(model)
    cfg = model.cfg
    layers = [_pack_layer(block, cfg.layer_window(int(name)), cfg.n_heads, cfg.n_kv_heads)
              for name, block in model.layers.items()]
    return PackedModel(embedding=model.tok_embeddings.weight.detach(), layers=layers,
                       norm=model.norm.weight.detach().clone(), head=_weight(model.output).t().contiguous(),
                       norm_eps=cfg.norm_eps, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                       head_dim=cfg.resolved_head_dim)


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


_PACKS: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple, PackedModel]]" = weakref.WeakKeyDictionary()


def packed_weights(model: Transformer) -> PackedModel:
    """The pack of ``model``'s current weights: the one made earlier when no parameter changed since, else new."""
    model = _inner(model)
    key = _state_key(model)
    hit = _PACKS.get(model)
    if hit is not None and hit[0] == key:
        return hit[1]
    _PACKS.pop(model, None)  # free the stale copy before making the new one
    packed = pack(model)
    _PACKS[model] = (key, packed)
    return packed
