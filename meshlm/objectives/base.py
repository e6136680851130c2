"""The objective interface."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

IGNORE_INDEX = -100


class Objective(Protocol):
    """Turns a batch into a summed loss; the trainer normalises by the global count of loss tokens.

    Returning a *sum* (not a mean) lets the trainer divide by the token count of the whole global batch, so
    gradient accumulation and data parallelism give exactly the gradient of one big batch.
    """

    name: str

    def num_loss_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | int:
        """How many targets in ``batch`` contribute to the loss: preferably a 0-dim tensor on the batch's device,
        so that the trainer can scale the loss by the global count without a host synchronisation."""
        ...

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Sum of per-token losses over ``batch`` (fp32 scalar)."""
        ...

    # Pipeline parallelism runs the model stage by stage, so the loss must be a function of the last stage's
    # output and the labels: objectives that support pp > 1 also define
    #     loss_from_logits(logits: Tensor (B, T, V), labels: Tensor (B, T)) -> Tensor  (summed, fp32)
