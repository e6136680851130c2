"""Data parallelism, applied last: FSDP2 (``fully_shard``), HSDP (replicate x shard mesh) or DDP.

FSDP2 shards each block's parameters (fp32 master weights), gradients and optimizer state over the shard
dim; forward/backward all-gather one block's parameters at a time (in the compute dtype under mixed precision)
and reduce-scatter gradients in fp32. ``reshard_after_forward=never`` keeps gathered parameters until
backward (ZeRO-2-like: no second all-gather, more memory).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

_LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, precision: str, reshard: str, pipelined: bool) -> None:
    mp = MixedPrecisionPolicy(param_dtype=_LOW.get(precision), reduce_dtype=torch.float32)
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        if reshard == "default":
            # The last block's params are needed again right away by backward; under pipelining every
            # micro-batch would re-gather them, so keep them (as torchtitan does).
            keep = pipelined or i == len(blocks) - 1
        else:
            keep = reshard == "never"
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=not keep)
    _shard_ends(model, dp_mesh, mp, keep_embedding=pipelined or reshard == "never")
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=False)


def _shard_ends(model: nn.Module, dp_mesh: DeviceMesh, mp: MixedPrecisionPolicy, keep_embedding: bool) -> None:
    """The embedding and the (final norm, head) pair as FSDP units of their own, as torchtitan does.

    The embedding is used first in forward and last in backward: resharded in between, it is not held
    gathered (with its unsharded gradient) for the whole step — V·d parameters, large for big vocabularies.
    The head is used last in forward and first in backward, so it stays gathered. A tied embedding and head
    are one parameter and must be one unit: they stay in the root's group. Pipeline stages may lack either.
    """
    embedding, norm, head = model.tok_embeddings, model.norm, model.output
    if embedding is not None and head is not None and head.weight is embedding.weight:
        return  # tied: the root group holds both
    if embedding is not None:
        fully_shard(embedding, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=not keep_embedding)
    if head is not None:
        fully_shard([m for m in (norm, head) if m is not None], mesh=dp_mesh, mp_policy=mp,
                    reshard_after_forward=False)


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh) -> nn.Module:
    return DistributedDataParallel(model, process_group=dp_mesh.get_group(), broadcast_buffers=False)


def set_grad_sync(parts: list[nn.Module], enabled: bool) -> None:
    """Gradient reduction for one micro-step of an accumulation (``enabled`` on the last one).

    DDP skips its all-reduce until the last micro-step (``no_sync``): its gradients are full-size anyway, so
    this costs no memory. FSDP2 reduce-scatters on every micro-step, as torchtitan does: skipping it would keep
    each block's unsharded fp32 gradient alive until the last micro-step — the whole model per rank. The
    sharded gradients accumulate in place. Under HSDP only the all-reduce across replicas waits for the last
    micro-step (FSDP2 sums the reduce-scattered shards meanwhile), which costs one shard of memory.
    """
    for part in parts:
        if isinstance(part, FSDPModule):
            part.set_requires_gradient_sync(True)
            part.set_requires_all_reduce(enabled)  # only HSDP has an all-reduce to defer
        elif isinstance(part, DistributedDataParallel):
            part.require_backward_grad_sync = enabled
