"""Pretraining: next-token cross-entropy."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from meshlm.objectives.base import IGNORE_INDEX


class NextTokenObjective:
    name = "pretrain"

    def num_loss_tokens(self, batch: dict[str, torch.Tensor]) -> int:
        return int((batch["labels"] != IGNORE_INDEX).sum())

    @staticmethod
    def loss_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # Cross-entropy in fp32 whatever the compute precision: the softmax over a large vocabulary is where
        # bf16/fp16 lose the most.
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(0, 1), ignore_index=IGNORE_INDEX,
                               reduction="sum")

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(batch["input_ids"])  # (B, T, V)
        return self.loss_from_logits(logits, batch["labels"])
