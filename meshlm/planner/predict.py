"""The planner's prediction for a meshlm job config: the layout a run of that config uses, its memory per
rank and the collectives' bytes — what ``meshlm diagnose memory`` and every training run compare with
measurement."""

from __future__ import annotations

from typing import Any

from meshlm.config.schema import JobConfig
from meshlm.planner.collectives import step_collectives
from meshlm.planner.layout import Layout, Training
from meshlm.planner.memory import memory
from meshlm.planner.model_spec import ModelSpec, from_model_config


def layout_from_config(cfg: JobConfig, world: int, efficiency: float = 0.5, *, sequences_per_row: int = 1,
                       frozen_forwards: int = 0) -> tuple[ModelSpec, Layout, Training]:
    """The planner's inputs for a run of ``cfg`` on ``world`` ranks. LoRA comes from ``cfg.lora``; what the
    objective runs per row (``sequences_per_row``, ``frozen_forwards``: Objective's attributes of those names,
    passed by a caller that has the objective) from the caller."""
    from meshlm.distributed.parallel_dims import ParallelDims

    pc, tc = cfg.parallel, cfg.training
    dims = ParallelDims.from_config(pc, world)
    layout = Layout(dp_replicate=dims.dp_replicate, dp_shard=dims.dp_shard, tp=dims.tp, pp=dims.pp,
                    pp_schedule=pc.pp_schedule, stages_per_rank=pc.num_stages_per_rank if dims.pp > 1 else 1,
                    microbatches=(pc.microbatches or dims.pp) if dims.pp > 1 else 1,
                    micro_batch_size=tc.micro_batch_size, activation_checkpointing=tc.activation_checkpointing,
                    sharding="none", sequence_parallel=pc.sequence_parallel, loss_parallel=pc.loss_parallel,
                    reshard_after_forward=pc.reshard_after_forward)
    if layout.uses_fsdp:
        sharding = "zero2" if pc.reshard_after_forward == "never" else "zero3"
        layout = Layout(**{**layout.__dict__, "sharding": sharding})
    lora = cfg.lora
    training = Training(cfg.data.seq_len, tc.batch_size, tc.precision, "adamw", efficiency,
                        lora_rank=lora.rank, lora_targets=tuple(lora.targets) if lora.enabled else (),
                        sequences_per_row=sequences_per_row, frozen_forwards=frozen_forwards)
    return from_model_config(cfg.model), layout, training


def predict_rank(spec: ModelSpec, layout: Layout, training: Training, coords: dict[str, int]) -> dict[str, Any]:
    """Bytes of one rank (by mesh coordinates) and its counted collective payload per step."""
    pp, tp, shard = coords.get("pp", 0), coords.get("tp", 0), coords.get("dp_shard", 0)
    mem = memory(spec, layout, training, pp, tp, shard)
    colls = step_collectives(spec, layout, training, pp, tp, shard)
    out: dict[str, Any] = {k: getattr(mem, k) for k in ("params", "grads", "optimizer", "activations", "buffers")}
    out["total"] = mem.total
    counted = [c for c in colls if c.counted]
    out["comm_bytes_per_step"] = int(sum(c.bytes for c in counted)) if layout.world > 1 else 0
    by_kind: dict[str, dict[str, float]] = {}
    for c in counted:
        entry = by_kind.setdefault(c.kind, {"calls": 0, "bytes": 0})
        entry["calls"] += c.calls
        entry["bytes"] += int(c.bytes)
    out["comm"] = by_kind
    return out
