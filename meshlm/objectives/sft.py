"""Supervised fine-tuning: next-token cross-entropy on the assistant / completion tokens only, over packed rows.

The loader (meshlm/data/posttrain) already put IGNORE_INDEX on every label outside the loss (system and user
turns, prompts, padding, the last position of each row), and gives ``position_ids`` restarting at 0 per row and
``document_ids`` numbering the rows of a sequence: the model attends only within a row, so a packed sequence
computes what each row would alone. The loss is a sum, normalised by the trainer by the global count of loss
tokens, as for pretraining.
"""

from __future__ import annotations

import torch
from torch import nn

from meshlm.models.head import uses_fused_head
from meshlm.objectives.base import IGNORE_INDEX, Objective
from meshlm.objectives.pretrain import NextTokenObjective


class SFTObjective(Objective):
    name = "sft"
    data_kind = "sft"
    config_keys = ("packing", "eval_fraction")

    def num_loss_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return (batch["labels"] != IGNORE_INDEX).sum()  # () int64 on the device

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = dict(position_ids=batch["position_ids"], document_ids=batch["document_ids"])
        if uses_fused_head(model):  # the head computes the loss without logits (meshlm/models/head.py)
            return model(batch["input_ids"], labels=batch["labels"], **rows)
        logits = model(batch["input_ids"], **rows)  # (B, T, V)
        return NextTokenObjective.loss_from_logits(logits, batch["labels"])
