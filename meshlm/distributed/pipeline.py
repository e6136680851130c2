"""Pipeline parallelism with torch.distributed.pipelining: split the model into stages, build the schedule.

Stages are whole models with the layers of other stages deleted (and tok_embeddings / norm / output set to
None off the first / last stage), so parameter names — and therefore checkpoints — stay the same as without a
pipeline. Loop placement puts stages r, r+pp, … on rank r (GPipe, 1F1B, interleaved 1F1B, interleaved zero
bubble); V placement puts r and 2·pp−1−r there (ZBV).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
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


def build_schedule(parts: list[nn.Module], stage_indices: list[int], num_stages: int, pp_mesh: DeviceMesh,
                   device: torch.device, schedule: str, microbatches: int, loss_fn: Callable):
    group = pp_mesh.get_group()
    stages = [PipelineStage(part, idx, num_stages, device, group=group) for part, idx in zip(parts, stage_indices)]
    cls = SCHEDULES[schedule]
    # scale_grads=False: the loss function already divides by the global token count.
    if len(stages) == 1 and schedule in ("gpipe", "1f1b"):
        return cls(stages[0], microbatches, loss_fn=loss_fn, scale_grads=False)
    return cls(stages, microbatches, loss_fn=loss_fn, scale_grads=False)
