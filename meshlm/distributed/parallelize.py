"""Apply the engine's transformations to a built model, from outside: (TP →) activation checkpointing →
compile (→ FSDP/DDP). Single device is the case where the parallel steps are no-ops."""

from __future__ import annotations

from torch import nn

from meshlm.config.schema import TrainingConfig
from meshlm.distributed.activation_checkpoint import apply_activation_checkpointing


def apply_compile(model: nn.Module) -> None:
    """Compile each block separately: blocks are identical, so one graph is reused and compile time stays flat
    in depth."""
    for block in model.layers.values():
        block.compile()


def parallelize_model(model: nn.Module, training: TrainingConfig) -> nn.Module:
    apply_activation_checkpointing(model, training.activation_checkpointing)
    if training.compile:
        apply_compile(model)
    return model
