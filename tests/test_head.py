"""The output head's fused cross-entropy (meshlm/models/head.py) against torch's cross-entropy of the logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from meshlm.models import build_model, flavor_config
from meshlm.models.head import LinearCrossEntropy, OutputHead, linear_cross_entropy_sum, uses_fused_head
from meshlm.objectives.pretrain import NextTokenObjective


def _case(dtype=torch.float32, rows=37, d=16, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, d, generator=g).to(dtype).requires_grad_()
    w = (0.3 * torch.randn(vocab, d, generator=g)).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (rows,), generator=g)
    labels[[3, 10, 11]] = -100  # ignored positions
    return h, w, labels


def _reference(h, w, labels, scale, autocast=False):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = F.cross_entropy(F.linear(h, w).float(), labels, ignore_index=-100, reduction="sum")
    return loss, torch.autograd.grad(loss * scale, (h, w))


@pytest.mark.parametrize("chunk_rows", [1, 8, 1024])
def test_fp32_equals_cross_entropy_of_logits(chunk_rows):
    """Loss and both gradients match F.cross_entropy on the logits, over one or many chunks, ignored rows
    included; the incoming gradient (the trainer's 1/tokens scale) multiplies both."""
    h, w, labels = _case()
    ref, (gh_ref, gw_ref) = _reference(h, w, labels, 0.37)
    loss = linear_cross_entropy_sum(h, w, labels, chunk_rows=chunk_rows)
    gh, gw = torch.autograd.grad(loss * 0.37, (h, w))
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(gh, gh_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, gw_ref, rtol=1e-5, atol=1e-6)
    assert gh[[3, 10, 11]].abs().max() == 0  # ignored rows get no gradient


@pytest.mark.parametrize("mode", ["bf16-inputs", "autocast"])
def test_low_precision_matches_and_keeps_input_dtypes(mode):
    """bf16 weights and inputs (FSDP2's mixed precision) or fp32 under bf16 autocast: the loss is fp32 and close
    to the reference, and each gradient comes back in its input's dtype."""
    dtype = torch.bfloat16 if mode == "bf16-inputs" else torch.float32
    h, w, labels = _case(dtype)
    autocast = mode == "autocast"
    ref, (gh_ref, gw_ref) = _reference(h, w, labels, 1.0, autocast)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = linear_cross_entropy_sum(h, w, labels, chunk_rows=8)
    gh, gw = torch.autograd.grad(loss, (h, w))
    assert loss.dtype == torch.float32 and gh.dtype == dtype and gw.dtype == dtype
    torch.testing.assert_close(loss, ref, rtol=2e-3, atol=0.05)
    torch.testing.assert_close(gh.float(), gh_ref.float(), rtol=0.05, atol=0.02)
    torch.testing.assert_close(gw.float(), gw_ref.float(), rtol=0.05, atol=0.02)


def test_fp16_takes_the_logits_path_whose_loss_scale_applies_first():
    """In fp16 the head's weight-gradient sum over a micro-batch (here 4,096 rows, one frequent label, |h| ~ 20)
    exceeds fp16's range before the loss scale (1/tokens) applies: the fused Function overflows, so the head
    takes the cross-entropy of its logits, whose gradient is scaled before any fp16 rounding."""
    g = torch.Generator().manual_seed(0)
    h0 = torch.randn(4096, 8, generator=g).abs() + 20.0
    w0 = 0.02 * torch.randn(64, 8, generator=g)
    labels = torch.full((4096,), 3)
    head = OutputHead(8, 64).half()
    with torch.no_grad():
        head.weight.copy_(w0.half())
    h = h0.half().requires_grad_()
    (head(h, labels=labels) / 4096).backward()
    assert torch.isfinite(head.weight.grad).all() and torch.isfinite(h.grad).all()
    w = w0.half().requires_grad_()
    (linear_cross_entropy_sum(h0.half(), w, labels) / 4096).backward()
    assert not torch.isfinite(w.grad).all()  # what the fp16 routing avoids


def test_without_autograd_and_with_a_frozen_head():
    """Evaluation computes the loss alone; a frozen head (LoRA) gets no weight gradient and the same input
    gradient."""
    h, w, labels = _case()
    ref, (gh_ref, _) = _reference(h, w, labels, 1.0)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy_sum(h, w, labels, chunk_rows=8), ref, rtol=1e-6, atol=1e-4)
    frozen = w.detach()
    loss = linear_cross_entropy_sum(h, frozen, labels)
    loss.backward()
    torch.testing.assert_close(h.grad, gh_ref, rtol=1e-5, atol=1e-6)
    assert frozen.grad is None


def test_second_backward_is_refused():
    """Backward scales the saved gradients in place, so a second backward through a retained graph would be
    wrong: it raises instead."""
    h, w, labels = _case()
    loss = LinearCrossEntropy.apply(h, w, labels, 8)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="runs once"):
        loss.backward()


def test_model_loss_equals_the_logits_path_and_tp_heads_refuse_labels():
    """The decoder's loss through its head equals the chunked cross-entropy of its logits (the `small` flavour:
    tied embedding, so the weight gradient adds to the embedding's), to fp32 rounding; a head with the
    fused path off (tensor parallelism) refuses labels."""
    cfg = flavor_config("small")
    model = build_model(cfg, torch.device("cpu"), seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    labels = torch.roll(tokens, -1, 1)
    labels[:, -1] = -100
    assert uses_fused_head(model) and isinstance(model.output, OutputHead)
    fused = NextTokenObjective().loss_sum(model, {"input_ids": tokens, "labels": labels})
    g_fused = torch.autograd.grad(fused, list(model.parameters()))
    logits = NextTokenObjective.loss_from_logits(model(tokens), labels)
    g_logits = torch.autograd.grad(logits, list(model.parameters()))
    torch.testing.assert_close(fused, logits, rtol=1e-6, atol=1e-3)
    for a, b in zip(g_fused, g_logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    model.output.fused = False
    assert not uses_fused_head(model)
    with pytest.raises(ValueError, match="logits only"):
        model(tokens, labels=labels)
