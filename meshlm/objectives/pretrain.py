"""Pretraining: next-token cross-entropy. Where it can, the model's head computes it without logits
(meshlm/models/head.py); otherwise (tensor or pipeline parallelism, fp16) it is taken from the logits in row chunks,
so that no full-size fp32 copy of the logits (nor of their log-softmax, nor a full one-hot gradient buffer) is ever
materialised beside them (``ChunkedCrossEntropy``, also in meshlm/models/head.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from meshlm.models.head import CHUNK_ROWS, ChunkedCrossEntropy, uses_fused_head  # noqa: F401 (re-exported)
from meshlm.objectives.base import IGNORE_INDEX, Objective


class NextTokenObjective(Objective):
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
