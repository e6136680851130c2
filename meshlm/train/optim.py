"""Optimizer construction: AdamW with decay on matrices only."""

from __future__ import annotations

import torch
from torch import nn

from meshlm.config.schema import OptimizerConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on 2D+ weights (linears, embeddings); none on norms and biases."""
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    # foreach=True keeps one code path for plain tensors and DTensors (FSDP2/TP shards).
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             eps=cfg.eps, foreach=True)
