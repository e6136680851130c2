"""The pretraining loss: chunked cross-entropy against torch's F.cross_entropy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from meshlm.objectives.base import IGNORE_INDEX
from meshlm.objectives.pretrain import ChunkedCrossEntropy, NextTokenObjective


@pytest.mark.parametrize("chunk_rows", [1, 5, 4096])  # many uneven chunks, one chunk
def test_chunked_cross_entropy_matches_torch(chunk_rows):
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 9, 50, generator=g)).requires_grad_()
    labels = torch.randint(0, 50, (2, 9), generator=g)
    labels[0, :3] = IGNORE_INDEX  # ignored targets count for nothing, in the loss and in the gradient
    ref_logits = logits.detach().clone().requires_grad_()
    loss = ChunkedCrossEntropy.apply(logits.flatten(0, 1), labels.flatten(0, 1), chunk_rows)
    ref = F.cross_entropy(ref_logits.flatten(0, 1), labels.flatten(0, 1), ignore_index=IGNORE_INDEX, reduction="sum")
    (2.5 * loss).backward()
    (2.5 * ref).backward()
    # fp32 rounding only: sums of 15 per-row losses ~4 each, and per-element softmax differences ~1e-7
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert torch.allclose(logits.grad, ref_logits.grad, atol=1e-6, rtol=1e-5)
    assert torch.all(logits.grad[0, :3] == 0)


def test_low_precision_logits_get_an_fp32_loss_and_a_same_dtype_gradient():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 7, 64, generator=g).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 64, (4, 7), generator=g)
    loss = NextTokenObjective.loss_from_logits(logits, labels)
    loss.backward()
    ref = F.cross_entropy(logits.detach().float().flatten(0, 1), labels.flatten(0, 1), reduction="sum")
    assert loss.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)  # both computed in fp32 from the same bf16 values
