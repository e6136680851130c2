"""Pretraining: next-token cross-entropy, computed in row chunks so that no full-size fp32 copy of the logits
(nor of their log-softmax, nor a full one-hot gradient buffer) is ever materialised beside the logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from meshlm.models.head import uses_fused_head
from meshlm.objectives.base import IGNORE_INDEX

# Rows of (rows, V) handled at once: 4096 × V fp32 is 64 MiB at V = 4096 and 2 GiB at V = 128k; the chunk is the
# only fp32 (rows, V) temporary, so memory stays flat in the sequence length. Measured on the `small` flavour it
# is as fast as one chunk (docs/benchmarks.md).
CHUNK_ROWS = 4096


def _targets(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) mask of rows that count, and labels with ignored rows pointed at column 0 (read, then zeroed)."""
    valid = labels != IGNORE_INDEX
    return valid, torch.where(valid, labels, 0)


class ChunkedCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of ``logits`` (N, V) against ``labels`` (N,), ignoring IGNORE_INDEX.

    Forward keeps only each row's log-sum-exp (N fp32 values); backward rebuilds softmax − one-hot one chunk at
    a time, in fp32, and writes it straight into the gradient in the logits' dtype. Equal to
    ``F.cross_entropy(logits.float(), labels, reduction="sum")`` up to fp32 rounding (summation order).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)  # (N,)
        for start in range(0, logits.shape[0], chunk_rows):
            lse[start:start + chunk_rows] = torch.logsumexp(logits[start:start + chunk_rows].float(), dim=-1)
        valid, safe = _targets(labels)
        target = logits.gather(1, safe[:, None]).squeeze(1).float()  # (N,) the target's logit
        # Saved: the logits and labels (which exist anyway) and lse, 4 bytes per row; masks are rebuilt.
        ctx.save_for_backward(logits, labels, lse)
        ctx.chunk_rows = chunk_rows
        return torch.where(valid, lse - target, 0.0).sum()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        valid, safe = _targets(labels)
        row_scale = grad.float() * valid  # (N,) 0 on ignored rows
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            probs = torch.exp(logits[rows].float() - lse[rows, None])  # (n, V) softmax
            probs.scatter_add_(1, safe[rows, None], -torch.ones_like(lse[rows, None]))  # − one-hot
            grad_logits[rows] = probs.mul_(row_scale[rows, None])
        return grad_logits, None, None


class NextTokenObjective:
    name = "pretrain"

    def num_loss_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return (batch["labels"] != IGNORE_INDEX).sum()  # () int64, left on the device

    @staticmethod
    def loss_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Summed fp32 cross-entropy of (B, T, V) logits; also the pipeline's last-stage loss."""
        if isinstance(logits, DTensor):
            # Loss parallelism: logits sharded along the vocabulary; torch's loss_parallel() implements
            # cross_entropy on the shards (a max and a sum all-reduced over tp), so full logits never exist.
            return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(0, 1), ignore_index=IGNORE_INDEX,
                                   reduction="sum")
        # Cross-entropy in fp32 whatever the compute precision: the softmax over a large vocabulary is where
        # bf16/fp16 lose the most.
        return ChunkedCrossEntropy.apply(logits.flatten(0, 1), labels.flatten(0, 1), CHUNK_ROWS)

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if uses_fused_head(model):  # the head computes the loss without logits (meshlm/models/head.py)
            return model(batch["input_ids"], labels=batch["labels"])
        logits = model(batch["input_ids"])  # (B, T, V)
        return self.loss_from_logits(logits, batch["labels"])
