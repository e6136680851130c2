"""Megatron-style tensor parallelism with DTensor, keyed by the model's module names.

Per block: wq/wk/wv and w1/w3 are column-parallel (each rank owns whole heads / a slice of the SwiGLU width),
wo and w2 row-parallel, as the model's family spec declares them (meshlm/models/families/). Without sequence
parallelism the block input is replicated and each row-parallel output is all-reduced. With sequence parallelism the norms and residual stream are sharded along the sequence; the
all-reduce becomes an all-gather before attention/FFN and a reduce-scatter after (same total volume, norm
activations 1/tp as large). With loss parallelism the output head keeps logits sharded along the vocabulary
and the cross-entropy runs on the shards (`loss_parallel()`), so full logits are never gathered.
"""

from __future__ import annotations

import contextlib

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from meshlm.models.families import spec_of


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool,
                          use_loss_parallel: bool) -> None:
    """Shard ``model`` (a whole model or a pipeline stage) in place over ``tp_mesh``."""
    residual = Shard(1) if sequence_parallel else Replicate()  # layout of the (B, T, D) residual stream
    top: dict[str, object] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=residual)
    if model.norm is not None and sequence_parallel:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=residual,
                                        output_layouts=Shard(-1) if use_loss_parallel else Replicate(),
                                        use_local_output=not use_loss_parallel)
    names = list(model.layers.keys())
    if sequence_parallel and model.tok_embeddings is None:
        # A later pipeline stage receives the residual stream as a full tensor from the previous stage: shard it
        # along the sequence for this stage's first block.
        top[f"layers.{names[0]}"] = PrepareModuleInput(
            input_layouts=(Replicate(), None, None, None, None),
            desired_input_layouts=(Shard(1), None, None, None, None), use_local_output=True)
    if sequence_parallel and model.output is None:
        # ... and sends a full tensor to the next stage.
        top[f"layers.{names[-1]}"] = PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate(),
                                                          use_local_output=True)
    parallelize_module(model, tp_mesh, top)
    if model.output is not None and hasattr(model.output, "fused"):
        # The head's logits stay sharded along the vocabulary (loss parallelism) or are gathered: its fused
        # cross-entropy (plain tensors only) is off, the objective takes the cross-entropy of the logits.
        model.output.fused = False
    # parallelize_module gives tok_embeddings and output a DTensor each, which unties a tied head. Both are
    # sharded along the vocabulary (Shard(0) of the (V, D) weight) on the same mesh, so the embedding's DTensor
    # serves the head as is: tie them again; their gradients then accumulate into the one parameter.
    model.tie_weights()

    linears = spec_of(model.cfg).linears
    for block in model.layers.values():
        plan: dict[str, object] = {  # row-parallel outputs go back to the residual stream's layout
            lin.module: ColwiseParallel() if lin.parallel == "colwise" else RowwiseParallel(output_layouts=residual)
            for lin in linears}
        if block.attention.q_norm is not None:
            # Qwen3's q/k norms: one (Dh,) weight shared by all heads, while each rank holds only its heads of
            # (B, T, H, Dh). As Replicate DTensors applied to a head-sharded (Shard(2)) input, their gradients are
            # the sum over every head of every rank (DTensor all-reduces the partial sums), as on one device.
            plan["attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan["attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        if sequence_parallel:
            plan.update({
                "attention_norm": SequenceParallel(),
                "ffn_norm": SequenceParallel(),
                # Gemma's norms after attention and the MLP act on the row-parallel outputs (sequence-sharded local
                # tensors) and hand a local tensor back to the residual add.
                **({"post_attention_norm": SequenceParallel(use_local_output=True),
                    "post_ffn_norm": SequenceParallel(use_local_output=True)}
                   if block.post_attention_norm is not None else {}),
                # Gather the sequence before the projections; cos/sin and cache arguments pass through as is.
                "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None, None, None),
                                                desired_input_layouts=(Replicate(), None, None, None, None)),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, tp_mesh, plan)


def loss_context(tp_enabled: bool, use_loss_parallel: bool) -> contextlib.AbstractContextManager:
    """The context the loss (forward and backward) must run in."""
    return loss_parallel() if tp_enabled and use_loss_parallel else contextlib.nullcontext()
