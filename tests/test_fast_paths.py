"""The model's faster formulations equal the plain ones bit for bit (fp32), forward and backward."""

from __future__ import annotations

import torch

from meshlm.models.llama import RMSNorm, apply_rope


def _grads(fn, *inputs):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    return out.detach(), [t.grad for t in inputs]


def test_rms_norm_equals_the_plain_formula():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 48, generator=g)
    norm = RMSNorm(48, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(48, generator=g))

    def plain(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.detach()

    fast_out, fast_grads = _grads(lambda x: norm(x) * 1.0, x)
    ref_out, ref_grads = _grads(plain, x)
    assert torch.equal(fast_out, ref_out)
    assert torch.allclose(fast_grads[0], ref_grads[0], rtol=1e-6, atol=1e-7)  # backward: same math, fp32 order


def test_rope_equals_four_half_width_products():
    g = torch.Generator().manual_seed(0)
    x, angles = torch.randn(2, 6, 3, 16, generator=g), torch.randn(6, 8, generator=g)
    cos, sin = angles.cos(), angles.sin()

    def plain(x):
        x1, x2 = x.chunk(2, dim=-1)
        c, s = cos[None, :, None], sin[None, :, None]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    fast_out, fast_grads = _grads(lambda x: apply_rope(x, cos, sin), x)
    ref_out, ref_grads = _grads(plain, x)
    assert torch.equal(fast_out, ref_out)
    assert torch.equal(fast_grads[0], ref_grads[0])
    half = apply_rope(x.to(torch.bfloat16), cos, sin)  # low precision: rotated in fp32, returned in bf16
    assert half.dtype == torch.bfloat16 and torch.allclose(half.float(), ref_out, atol=0.05)
