"""Activation checkpointing applied from outside the model, per transformer block.

``full`` recomputes the whole block in backward (keeps only the block input). ``selective`` keeps the outputs of
the matmuls, of attention and of tensor-parallel collectives, and recomputes the cheap element-wise ops (norms,
SwiGLU gate, RoPE) — most of the memory saving at a small fraction of the recompute cost, and no extra
communication.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def must_save(op) -> bool:
    """Selective AC keeps matmul and attention outputs, and every functional collective's output: tensor
    parallelism's all-gather / reduce-scatter / all-reduce (and their wait_tensor) are DTensor's
    ``_c10d_functional`` ops, and recomputing one in backward would repeat the communication, not just cheap
    arithmetic (torchtitan saves them for the same reason)."""
    return op in _SAVE_OPS or getattr(op, "namespace", None) == "_c10d_functional"


def _selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if must_save(op) else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    return create_selective_checkpoint_contexts(_selective_policy)


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """Wrap each block of ``model.layers`` in place. State-dict names are unchanged (the wrapper strips its
    prefix), so checkpoints move freely between modes."""
    if mode == "none":
        return
    for name, block in list(model.layers.named_children()):
        # A block that draws random masks (LoRA dropout) must recompute with the masks its forward drew: the
        # wrapper then saves and restores the RNG state around the recompute. Without dropout there is nothing
        # to replay, and saving the state per block would be wasted work.
        replay = any(isinstance(m, nn.Dropout) and m.p > 0 for m in block.modules())
        if mode == "full":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=replay)
        else:
            wrapped = checkpoint_wrapper(block, preserve_rng_state=replay, context_fn=_selective_context)
        model.layers.register_module(name, wrapped)
