"""Eager fast paths for the decoder block: hand-written autograd Functions for RMSNorm and RoPE.

Why: autograd's composite graph for these two runs many small memory-bound ops; a Function with a closed-form
backward runs fewer (the RMSNorm's forward + backward 2.8 → 1.6 ms at the `small` flavour's shapes on one
core; docs/benchmarks.md, "Faster than the peers"). They save the same tensors as the composite code, which the
planner counts. Each computes the same formula as the composite code in meshlm/models/llama.py (same ops in
forward; backward from the closed-form gradient); tests/test_fast_paths.py checks both against the formulas.

They apply only where they are exact and cheap: plain tensors (never DTensors: tensor/sequence parallelism keeps
the composite code, whose sharding rules DTensor knows), with autograd recording (inference keeps the composite
path, so generation is unchanged), and outside torch.compile (Inductor fuses the composite code itself).
"""

from __future__ import annotations

import torch
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
    """Rotate x (B, T, H, Dh) by the full-width tables (B|1, T, 1, Dh): x·cos2 + swap(x)·sin2.

    The rotation is orthogonal, so backward is the transposed rotation, dx = g·cos2 + swap(g·sin2): four ops
    and one autograd node instead of the composite form's graph through chunk, cat and two products. Only the
    tables are saved, like the composite form; same ops and roundings, so bitwise equal in fp32.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos2, sin2)
        return _rotate(x, cos2, sin2, transpose=False)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos2, sin2 = ctx.saved_tensors
        return _rotate(grad, cos2, sin2, transpose=True), None, None


def _rotate(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor, transpose: bool) -> torch.Tensor:
    """x·cos2 + swap(x)·sin2, or its transpose g·cos2 + swap(g·sin2), in fp32 (each product, then the sum,
    rounded as in the composite form), returned in x's dtype."""
    xf = x.float()
    out = xf * cos2
    out += _swap_halves(xf * sin2) if transpose else _swap_halves(xf) * sin2
    return out.to(x.dtype)


def apply_rope_fused(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """x (B, T, H, Dh) rotated by full-width tables (B|1, T, 1, Dh)."""
    return RoPEFunction.apply(x, cos2, sin2)
