"""llama.cpp's names and layouts for meshlm's tensors, shared by GGUF import and export.

Names: llama.cpp calls ``layers.3.attention.wq.weight`` ``blk.3.attn_q.weight`` (and so on, one to one).

Architectures: those the family specs name (``llama``, ``qwen2``, ``qwen3``; ``gemma3``). llama.cpp has no ``mistral`` architecture: its convert script
writes Mistral (and Llama 2/3, SmolLM) models as ``llama`` (transformers' GGUF loader, too, reads no other name
for them).

Q/K row order: llama.cpp's convert script reorders the rows of the q and k projections of ``llama`` models from
the rotate-half RoPE layout meshlm and Hugging Face use, where a head's first half of rows pairs with its second
half, to the interleaved layout its kernels expect, where rows 2i and 2i+1 pair. ``qwen2`` and ``qwen3`` files
keep the rotate-half order (llama.cpp runs them with NeoX-style RoPE); transformers' GGUF loader undoes the
reordering for ``llama`` only, as meshlm does.
"""

from __future__ import annotations

import torch

from meshlm.models.families import FAMILIES, family_spec

# Every llama.cpp architecture some family reads (the specs say).
ARCHITECTURES = tuple(a for name in FAMILIES for a in family_spec(name).gguf_architectures)


def gguf_name(name: str, family: str) -> str:
    """The llama.cpp name of a meshlm state-dict key in ``family``, e.g. layers.3.feed_forward.w1.weight ->
    blk.3.ffn_gate.weight (meshlm/models/families/)."""
    return family_spec(family).external_name(name, "gguf")


def heads_of(name: str, n_heads: int, n_kv_heads: int) -> int | None:
    """How many heads the rows of meshlm tensor ``name`` hold when llama.cpp reorders them (q: n_heads, k:
    n_kv_heads), or None for a tensor it keeps as is (biases are never reordered: only Qwen2 has them)."""
    if name.endswith("attention.wq.weight"):
        return n_heads
    if name.endswith("attention.wk.weight"):
        return n_kv_heads
    return None


def to_interleaved(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rotate-half rows -> llama.cpp's interleaved rows: within each head, row j of the first half and row j of
    the second half become rows 2j and 2j+1."""
    rows, cols = weight.shape
    half = rows // n_heads // 2
    return weight.reshape(n_heads, 2, half, cols).transpose(1, 2).reshape(rows, cols)  # (H, half, 2, in)


def from_interleaved(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of :func:`to_interleaved`."""
    rows, cols = weight.shape
    half = rows // n_heads // 2
    return weight.reshape(n_heads, half, 2, cols).transpose(1, 2).reshape(rows, cols)  # (H, 2, half, in)
