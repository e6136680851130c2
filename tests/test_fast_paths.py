"""The model's faster formulations against the plain ones, forward and backward: the hand-written autograd
Functions of meshlm/models/fused.py (bitwise where they run the same ops, fp32 rounding otherwise), in fp32 and
bf16, and the whole model with and without its fast paths."""

from __future__ import annotations

import pytest
import torch

import meshlm.models.llama as llama
from meshlm.models import build_model, flavor_config
from meshlm.models.fused import rms_norm, rope_tables, use_fast_path
from meshlm.models.llama import RMSNorm, apply_rope
from meshlm.objectives import NextTokenObjective


def _grads(fn, *inputs):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out).to(out.dtype))
    return out.detach(), [t.grad for t in inputs]


def _plain_rms(x, w, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _plain_rope(x, cos, sin):
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos[None, :, None], sin[None, :, None]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


def test_rms_norm_equals_the_plain_formula():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 5, 48, generator=g), 1 + 0.1 * torch.randn(48, generator=g)
    fast_out, (fast_x, fast_w) = _grads(lambda x, w: rms_norm(x, w, 1e-5), x, w)
    ref_out, (ref_x, ref_w) = _grads(_plain_rms, x, w)
    assert torch.equal(fast_out, ref_out)  # forward: the same ops
    torch.testing.assert_close(fast_x, ref_x, rtol=1e-5, atol=1e-6)  # backward: closed form, fp32 rounding
    torch.testing.assert_close(fast_w, ref_w, rtol=1e-5, atol=1e-5)
    norm = RMSNorm(48)  # the module takes the fast path when training...
    with torch.no_grad():
        norm.weight.copy_(w)
    assert norm(x.requires_grad_()).grad_fn.name().startswith("RMSNormFunction")
    with torch.no_grad():  # ...and the composite path in inference, with the same values
        assert torch.equal(norm(x), ref_out)


def test_rms_norm_bf16_input():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(3, 7, 32, generator=g).to(torch.bfloat16), 1 + 0.1 * torch.randn(32, generator=g)
    fast_out, (fast_x, fast_w) = _grads(lambda x, w: rms_norm(x, w, 1e-5), x, w)
    ref_out, (ref_x, ref_w) = _grads(_plain_rms, x, w)
    assert fast_out.dtype == ref_out.dtype and fast_x.dtype == torch.bfloat16 and fast_w.dtype == torch.float32
    assert torch.equal(fast_out, ref_out)
    torch.testing.assert_close(fast_x.float(), ref_x.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(fast_w, ref_w, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_equals_four_half_width_products(dtype):
    g = torch.Generator().manual_seed(0)
    x, angles = torch.randn(2, 6, 3, 16, generator=g).to(dtype), torch.randn(6, 8, generator=g)
    cos, sin = angles.cos(), angles.sin()
    ref_out, (ref_grad,) = _grads(lambda x: _plain_rope(x, cos, sin), x)
    for tables in ((cos, sin), rope_tables(cos, sin)):  # half-width or full-width tables
        fast_out, (fast_grad,) = _grads(lambda x: apply_rope(x, *tables), x)
        assert fast_out.dtype == dtype
        if dtype == torch.float32:
            assert torch.equal(fast_out, ref_out) and torch.equal(fast_grad, ref_grad)
        else:  # rotated in fp32 and rounded once, like the reference; the gradient rounds to bf16 once too
            assert torch.equal(fast_out, ref_out)
            torch.testing.assert_close(fast_grad.float(), ref_grad.float(), rtol=1e-2, atol=1e-2)
    with torch.no_grad():  # the composite path (inference) gives the same values
        assert torch.equal(apply_rope(x, cos, sin), ref_out)


def test_fast_path_applies_only_when_training_eagerly_on_plain_tensors():
    x = torch.randn(2, 3, 8)
    assert use_fast_path(x)
    with torch.no_grad():
        assert not use_fast_path(x)
    from torch.distributed.tensor import DTensor

    class FakeDTensor(DTensor):  # isinstance is all the gate looks at; building a real one needs a process group
        def __new__(cls):
            return torch.Tensor._make_subclass(cls, torch.zeros(1))

    assert not use_fast_path(x, FakeDTensor())


@pytest.fixture(scope="module")
def tiny_model():
    cfg = flavor_config("debug")
    cfg.dim, cfg.n_layers, cfg.ffn_hidden_dim, cfg.vocab_size = 32, 2, 48, 128
    cfg.qkv_bias = True
    return cfg


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_model_fast_paths_match_the_composite_model(tiny_model, qk_norm, precision, monkeypatch):
    cfg = tiny_model
    cfg.qk_norm = qk_norm
    model = build_model(cfg, torch.device("cpu"), seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(5))
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
    results = []
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(llama, "use_fast_path", lambda *a: False)
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = NextTokenObjective().loss_sum(model, batch)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (fast_loss, fast_grads), (ref_loss, ref_grads) = results
    tol = dict(rtol=1e-5, atol=1e-5) if precision == "fp32" else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(fast_loss, ref_loss, **tol)
    for name, ref in ref_grads.items():
        scale = ref.abs().max().clamp_min(1e-6)
        torch.testing.assert_close(fast_grads[name] / scale, ref / scale, **tol, msg=name)
