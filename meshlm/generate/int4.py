"""4-bit weights for CPU decoding: ``--weights int4`` of generate, serve and bench generate.

A decode step's time is the weights' bytes over the memory bandwidth (int8.py); 4-bit weights are an eighth of
fp32's. torch ships a CPU kernel for them, ``aten._weight_int4pack_mm_for_cpu``, on weights packed once by
``aten._convert_weight_to_int4pack_for_cpu``. Each (out, in) weight is split along ``in`` into groups of
:data:`GROUP_SIZE` and every group keeps its own scale and zero point (asymmetric: the group's min..max onto the 16
levels), the kernel's convention being ``w = (q - 8) · scale + zero`` with q in 0..15.

The activations go in as bf16: measured on the development machine (AMD EPYC with AVX-512, torch 2.13, one
thread; docs/benchmarks.md "4-bit decode weights"), the kernel with fp32 activations is 15-60x *slower* than an
fp32 matmul (a scalar path), and with bf16 activations 2-10x faster (one row times SmolLM2's 576 -> 1536 matrix:
0.028 ms against fp32's 0.058; its 49k-row head: 1.6 ms against 16.8 ms). Scales and zeros are therefore stored
in bf16, and q is rounded against those stored values. So the product differs from fp32's by the 4-bit rounding
of the weights (the larger part: ~7% relative error of a random matrix's product) and the bf16 rounding of the
activations (~0.3%); the effect on a real model's logits and greedy tokens is in docs/benchmarks.md, and is why
int4 is opt-in. As with int8, the norms, RoPE, attention, the KV cache, the embedding lookup and a prefill stay
fp32 (decode.py ``FastForward.weights``).

A matrix whose ``in`` is not a multiple of the group size, or whose ``out`` is not one of 16, has no int4 layout:
:func:`int4_or_fp32` keeps it in fp32 (an (in, out) view, as the view pack holds it).
"""

from __future__ import annotations

import torch

GROUP_SIZE = 32  # the kernel takes 32, 64, 128 or 256; the smallest group has the smallest error


def int4_unavailable_reason() -> str | None:
    """Why this torch cannot run int4 weights (None when it can)."""
    ops = ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu")
    missing = [op for op in ops if not hasattr(torch.ops.aten, op)]
    return f"this torch build lacks aten.{missing[0]}" if missing else None


def quantize_groups(weight: torch.Tensor, group_size: int = GROUP_SIZE
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, in) fp32 -> (q (out, in) int32 in 0..15, scale (out, in / g) bf16, zero (out, in / g) bf16) such
    that w ≈ (q - 8) · scale + zero, each group's min and max mapped onto the 16 levels."""
    out_f, in_f = weight.shape
    groups = weight.float().reshape(out_f, in_f // group_size, group_size)  # (out, G, g)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # (out, G)
    scale = ((high - low) / 15).clamp_min(1e-8).bfloat16()
    zero = (low + 8 * scale.float()).bfloat16()  # the kernel's zero point is the value of level 8
    levels = (groups - zero.float()[..., None]) / scale.float()[..., None] + 8
    q = levels.round().clamp(0, 15).to(torch.int32).reshape(out_f, in_f)
    return q, scale, zero


class Int4Matrix:
    """x (N, in) -> x Wᵀ (+ bias) (N, out) in fp32, W held as 4-bit groups in torch's CPU int4 layout."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, group_size: int = GROUP_SIZE) -> None:
        weight = weight.detach().float().contiguous()  # (out, in)
        q, scale, zero = quantize_groups(weight, group_size)
        self._packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)  # (out, in / 2) uint8
        self._scales_zeros = torch.stack([scale.t(), zero.t()], dim=-1).contiguous()  # (in / g, out, 2) bf16
        self.group_size = group_size
        self.bias = None if bias is None else bias.detach().float()
        self.shape = (weight.shape[1], weight.shape[0])  # as the (in, out) matrices of the fp32 packs

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self._packed, self.group_size,
                                                          self._scales_zeros).float()  # (N, out)
        return out if self.bias is None else out.add_(self.bias)

    def nbytes(self) -> int:
        """Bytes held: half a byte a weight, a bf16 scale and zero a group, the fp32 bias."""
        bias = 0 if self.bias is None else 4 * self.bias.numel()
        return self._packed.numel() * self._packed.element_size() + 2 * self._scales_zeros.numel() + bias

    def dequantized(self) -> torch.Tensor:
        """The (out, in) fp32 weight the 4-bit values stand for (tests, error reports): the identity's product, on
        the kernel's exact fp32 path."""
        eye = torch.eye(self.shape[0])
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self._packed, self.group_size,
                                                         self._scales_zeros.float())  # (in, out)
        return out.t().contiguous()


def int4_or_fp32(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int4Matrix | torch.Tensor:
    """An :class:`Int4Matrix` of the (out, in) ``weight``, or — where ``in`` is not a multiple of
    :data:`GROUP_SIZE` or ``out`` one of 16 (the kernel's) — the fp32 (in, out) view, with its bias."""
    if weight.shape[1] % GROUP_SIZE or weight.shape[0] % 16:
        return weight.detach().t() if bias is None else _WithBias(weight.detach().t(), bias.detach())
    return Int4Matrix(weight, bias)


class _WithBias:
    """An fp32 (in, out) matrix plus a bias, called like the quantized matrices (int4_or_fp32's fallback)."""

    def __init__(self, matrix: torch.Tensor, bias: torch.Tensor) -> None:
        self.matrix, self.bias, self.shape = matrix, bias, tuple(matrix.shape)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.matrix)
