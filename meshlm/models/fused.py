"""Eager fast paths for the decoder block: hand-written autograd Functions and fused projections.

Why: at small shapes on CPU a training step is mostly per-op overhead and memory-bound element-wise passes, so
eager mode wins by running fewer ops and saving fewer tensors. Each Function here computes the same formula as
the composite code in meshlm/models/llama.py (same ops in forward; backward from the closed-form gradient), and
tests/test_fast_paths.py checks forward and backward against the reference formulas.

They apply only where they are exact and cheap: plain tensors (never DTensors: tensor/sequence parallelism keeps
the composite code, whose sharding rules DTensor knows), with autograd recording (inference keeps the composite
path, so generation is unchanged), and outside torch.compile (Inductor fuses the composite code itself).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor


def use_fast_path(*tensors: torch.Tensor | None) -> bool:
    """True when the hand-written paths apply: training in eager mode on plain tensors."""
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    return not any(isinstance(t, DTensor) for t in tensors if t is not None)


# -------------------------------------------------------------------------------------------------- RMSNorm
class RMSNormFunction(torch.autograd.Function):
    """y = (x · rstd).to(x.dtype) · w with rstd = rsqrt(mean(x²) + eps), in fp32.

    Backward from the closed form, with x̂ = x · rstd and ĝ = g · w: dx = rstd · (ĝ − x̂ · mean(ĝ · x̂)),
    dw = Σ_rows g · x̂ — 8 ops instead of autograd's ~14 through pow, mean, rsqrt and the products. It saves the
    tensors the composite form saves (x in fp32, rstd, the normalised value in x's dtype), so the planner's
    activation count (meshlm/planner/activations.py) holds on either path.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        # The ops of torch's CPU rms_norm, so the forward is bitwise equal to F.rms_norm.
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True).add_(eps))  # (..., 1) fp32
        normed = (xf * rstd).to(x.dtype)  # (..., D)
        ctx.save_for_backward(xf, rstd, normed, weight)
        return normed * weight

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        xf, rstd, normed, weight = ctx.saved_tensors
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            rows = normed.reshape(-1, normed.shape[-1])
            grad_w = (grad.reshape(rows.shape) * rows).sum(0).to(weight.dtype)  # (D,)
        if ctx.needs_input_grad[0]:
            x_hat = normed if normed.dtype == torch.float32 else xf * rstd  # fp32 x̂
            g_hat = grad.float() * weight.float()  # gradient w.r.t. the normalised value
            dot = (g_hat * x_hat).mean(-1, keepdim=True)  # (..., 1)
            grad_x = torch.addcmul(g_hat, x_hat, dot, value=-1).mul_(rstd).to(normed.dtype)
        return grad_x, grad_w, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return RMSNormFunction.apply(x, weight, eps)


# ----------------------------------------------------------------------------------------------------- RoPE
def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-width (..., Dh/2) cos/sin -> the full-width fp32 tables (cos, cos) and (−sin, sin) (..., Dh) that
    rotate x as x·cos2 + swap(x)·sin2, where swap exchanges the two halves of each head."""
    return torch.cat((cos, cos), dim=-1).float(), torch.cat((-sin, sin), dim=-1).float()


def _swap_halves(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, x1), dim=-1)


class RoPEFunction(torch.autograd.Function):
    """Rotate the first ``rotated`` heads of x (B, T, heads, Dh) by the full-width tables (B|1, T, 1, Dh) and
    pass the other heads through (v beside k, when q, k and v come from one fused projection): one new tensor
    holds them, so views of it do not keep the projection's output alive.

    The rotation is orthogonal, so backward is the transposed rotation: dx = g·cos2 + swap(g·sin2). Only the
    tables are saved, like the composite form. Same ops as the composite form: bitwise equal in fp32.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor, rotated: int) -> torch.Tensor:
        ctx.save_for_backward(cos2, sin2)
        ctx.rotated, ctx.dtype = rotated, x.dtype
        return _rotate(x, cos2, sin2, rotated, transpose=False)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos2, sin2 = ctx.saved_tensors
        return _rotate(grad, cos2, sin2, ctx.rotated, transpose=True).to(ctx.dtype), None, None, None


def _rotate(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor, rotated: int, transpose: bool) -> torch.Tensor:
    """x·cos2 + swap(x)·sin2 (or its transpose, g·cos2 + swap(g·sin2)) on the first ``rotated`` heads, the
    other heads copied; rounded like the composite form (each product, then the sum, in fp32)."""
    if x.dtype != torch.float32:  # rotate in fp32, round once to x's dtype
        out = _rotate(x.float(), cos2, sin2, rotated, transpose)
        return out.to(x.dtype)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    xr, turned = x[:, :, :rotated], out[:, :, :rotated]
    torch.mul(xr, cos2, out=turned)
    turned.add_(_swap_halves(xr * sin2) if transpose else _swap_halves(xr) * sin2)
    if rotated < x.shape[2]:
        out[:, :, rotated:] = x[:, :, rotated:]
    return out


def apply_rope_fused(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor, rotated: int | None = None) -> torch.Tensor:
    """x (B, T, heads, Dh) with the first ``rotated`` heads (all by default) rotated; tables (B|1, T, 1, Dh)."""
    return RoPEFunction.apply(x, cos2, sin2, x.shape[2] if rotated is None else rotated)


# --------------------------------------------------------------------------------------------------- SwiGLU
class SwiGLUFunction(torch.autograd.Function):
    """silu(a) · b of h = [a | b] (the fused w1/w3 projection's output, (..., 2F)) -> (..., F).

    Saves what the composite form saves (a and b, as h, and silu(a)) but writes both halves of the gradient
    into one buffer, so the fused projection's backward needs no concatenation. Same ops: bitwise equal.
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor) -> torch.Tensor:
        a, b = h.chunk(2, dim=-1)
        gate = F.silu(a)
        ctx.save_for_backward(h, gate)
        return gate * b

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        h, gate = ctx.saved_tensors
        a, b = h.chunk(2, dim=-1)
        grad_h = torch.empty_like(h)
        grad_a, grad_b = grad_h.chunk(2, dim=-1)
        torch.mul(grad, gate, out=grad_b)
        torch.ops.aten.silu_backward.grad_input(grad * b, a, grad_input=grad_a)
        return grad_h


def swiglu(h: torch.Tensor) -> torch.Tensor:
    return SwiGLUFunction.apply(h)


# ---------------------------------------------------------------------------------------- fused projections
def _plain_linear(module: nn.Module) -> bool:
    """An nn.Linear itself (not a subclass such as LoRA's), without hooks, holding plain tensors."""
    return (type(module) is nn.Linear and not module._forward_hooks and not module._forward_pre_hooks
            and not isinstance(module.weight, DTensor))


class FusedLinearFunction(torch.autograd.Function):
    """x @ cat(weights)^T (+ cat(biases)): several linears that share their input as one matmul.

    Saves x and the weights themselves, not their concatenation (under FSDP a saved copy would keep every
    layer's unsharded weights alive until backward); backward concatenates them again for the input gradient
    and returns each weight's gradient as its row block of one matmul.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, n: int, *params: torch.Tensor) -> torch.Tensor:
        weights, biases = params[:n], params[n:]
        ctx.save_for_backward(x, *weights)
        ctx.sizes = [w.shape[0] for w in weights]
        ctx.has_bias = bool(biases)
        return F.linear(x, torch.cat(weights), torch.cat(biases) if biases else None)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, *weights = ctx.saved_tensors
        n = len(weights)
        grad_x = grad @ torch.cat(weights) if ctx.needs_input_grad[0] else None
        grad_w = [None] * n
        rows = grad.reshape(-1, grad.shape[-1])  # (N, Σ out)
        if any(ctx.needs_input_grad[2:2 + n]):
            grad_w = list((rows.t() @ x.reshape(-1, x.shape[-1])).split(ctx.sizes))
        grad_b = list(rows.sum(0).split(ctx.sizes)) if ctx.has_bias and any(ctx.needs_input_grad[2 + n:]) else []
        if ctx.has_bias and not grad_b:
            grad_b = [None] * n
        return (grad_x, None, *grad_w, *grad_b)


def fused_linear(x: torch.Tensor, linears: list[nn.Module]) -> torch.Tensor | None:
    """x through several linears sharing it, as one matmul against their stacked weights: (..., Σ out).

    One larger matmul instead of several and one input gradient instead of a sum of several; costs a copy of
    the weights per call (twice with backward), small next to a training matmul (tokens ≫ 1) — hence only on
    the fast path. None when it does not apply (a LoRA layer, hooks, DTensors, mixed biases).
    """
    if torch.is_autocast_enabled(x.device.type) or not all(_plain_linear(m) for m in linears):
        return None  # under autocast the backward's matmuls would see mixed dtypes
    has_bias = [m.bias is not None for m in linears]
    if any(has_bias) and not all(has_bias):
        return None
    params = [m.weight for m in linears] + ([m.bias for m in linears] if has_bias[0] else [])
    return FusedLinearFunction.apply(x, len(linears), *params)
