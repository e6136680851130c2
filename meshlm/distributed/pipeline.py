"""Pipeline parallelism with torch.distributed.pipelining: split the model into stages, build the schedule.

Stages are whole models with the layers of other stages deleted (and tok_embeddings / norm / output set to
None off the first / last stage), so parameter names — and therefore checkpoints — stay the same as without a
pipeline. Loop placement puts stages r, r+pp, … on rank r (GPipe, 1F1B, interleaved 1F1B, interleaved zero
bubble); V placement puts r and 2·pp−1−r there (ZBV). The trainer splits a model on the meta device, so the
deep copies cost nothing: each stage is materialised after the split with only its own layers.

Tied embeddings: the first stage holds tok_embeddings.weight and the last output.weight, two copies of the one
matrix (see :class:`TiedEmbeddings`).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor import DTensor
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved-1f1b": ScheduleInterleaved1F1B,
    "interleaved-zb": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
}


def stage_ids(pp_rank: int, pp: int, stages_per_rank: int, schedule: str) -> list[int]:
    if schedule == "zbv":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(stages_per_rank)]


def layer_ranges(n_layers: int, num_stages: int) -> list[range]:
    """Contiguous layer ranges, earlier stages taking one extra layer when the split is uneven."""
    base, extra = divmod(n_layers, num_stages)
    ranges, start = [], 0
    for s in range(num_stages):
        size = base + (1 if s < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def split_model(model: nn.Module, stage_indices: list[int], num_stages: int) -> list[nn.Module]:
    ranges = layer_ranges(len(model.layers), num_stages)
    stages = []
    for s in stage_indices:
        stage = copy.deepcopy(model)
        keep = {str(i) for i in ranges[s]}
        for name in list(stage.layers.keys()):
            if name not in keep:
                del stage.layers[name]
        if s != 0:
            stage.tok_embeddings = None
        if s != num_stages - 1:
            stage.norm = None
            stage.output = None
        stages.append(stage)
    return stages


class TiedEmbeddings:
    """Tied embeddings across pipeline stages, kept exactly tied.

    The first stage's tok_embeddings.weight and the last stage's output.weight start equal (the head's init rule
    draws the embedding's values). The tied matrix's gradient is the sum of both uses, so after each backward
    :meth:`sync_grads` sums the two gradients (an all-reduce between the two ranks that hold them, over their
    identical shards: FSDP and TP shard both along the vocabulary the same way) and gives both copies the sum;
    identical optimizer steps on identical states then keep them bitwise equal. :meth:`duplicate_grads` names
    the head's copy, which the gradient norm must not count a second time.
    """

    def __init__(self, parts: list[nn.Module], stage_indices: list[int], num_stages: int, pp_mesh: DeviceMesh,
                 last_stage_rank: int) -> None:
        by_stage = dict(zip(stage_indices, parts))
        self.first, self.last = by_stage.get(0), by_stage.get(num_stages - 1)
        self.group = _holders_group(pp_mesh, last_stage_rank) if last_stage_rank != 0 else None

    def _copies(self) -> list[torch.Tensor]:
        copies = [self.first.tok_embeddings.weight] if self.first is not None else []
        return copies + ([self.last.output.weight] if self.last is not None else [])

    @torch.no_grad()
    def sync_grads(self) -> None:
        copies = self._copies()
        if not copies:
            return  # a middle stage: holds neither copy and is not in the group
        assert all(p.grad is not None for p in copies), "tied embedding copy without a gradient after backward"
        grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in copies]
        total = grads[0].clone() if len(grads) == 1 else grads[0] + grads[1]
        if self.group is not None:
            dist.all_reduce(total, group=self.group)
        for grad in grads:
            grad.copy_(total)

    def duplicate_grads(self) -> set[int]:
        """ids of the gradients not to count in the norm: the head's copy."""
        if self.last is None or self.last.output.weight.grad is None:
            return set()
        return {id(self.last.output.weight.grad)}


def _holders_group(pp_mesh: DeviceMesh, last_stage_rank: int) -> dist.ProcessGroup:
    """The group of pp rank 0 and pp rank ``last_stage_rank`` at this rank's data/tensor coordinates.

    new_group must be called by every process for every group, in the same order: the pp groups are the
    columns of the (pp, rest) rank grid init_device_mesh lays out row-major, so every rank enumerates them all.
    """
    pp = pp_mesh.size()
    if last_stage_rank == pp - 1 and pp == 2:
        return pp_mesh.get_group()  # the two holders are the whole pp group
    world = dist.get_world_size()
    stride = world // pp
    mine = None
    for offset in range(stride):
        ranks = [offset, offset + last_stage_rank * stride]
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = group
    return mine


def build_schedule(parts: list[nn.Module], stage_indices: list[int], num_stages: int, pp_mesh: DeviceMesh,
                   device: torch.device, schedule: str, microbatches: int, loss_fn: Callable):
    group = pp_mesh.get_group()
    stages = [PipelineStage(part, idx, num_stages, device, group=group) for part, idx in zip(parts, stage_indices)]
    cls = SCHEDULES[schedule]
    # scale_grads=False: the loss function already divides by the global token count.
    if len(stages) == 1 and schedule in ("gpipe", "1f1b"):
        return cls(stages[0], microbatches, loss_fn=loss_fn, scale_grads=False)
    return cls(stages, microbatches, loss_fn=loss_fn, scale_grads=False)
