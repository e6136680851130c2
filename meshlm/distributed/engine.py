"""The engine: owns the mesh and applies parallelism to a model built on the meta device, from outside, in this
order: pipeline split → per stage: tensor parallel (+ sequence / loss parallel) → activation checkpointing →
compile (full checkpointing under TP: compile, then checkpoint; see ``_checkpoint_outside_compile``) → FSDP2 /
HSDP; then it materialises only this rank's shards (meshlm/models/init.py) and, for plain data
parallelism, wraps the model in DDP. It also provides the reductions the trainer needs across data-parallel
ranks and pipeline stages. With every degree 1 (single device) each step is a no-op and there is no process
group.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor, Replicate

from meshlm.config.schema import ParallelConfig, TrainingConfig
from meshlm.distributed.activation_checkpoint import apply_activation_checkpointing
from meshlm.distributed.data_parallel import apply_ddp, apply_fsdp, set_grad_sync
from meshlm.distributed.parallel_dims import ParallelDims
from meshlm.distributed.pipeline import TiedEmbeddings, build_schedule, split_model, stage_ids
from meshlm.distributed.tensor_parallel import apply_tensor_parallel, loss_context
from meshlm.models.init import materialize


def to_float(value: torch.Tensor | float) -> float:
    if isinstance(value, DTensor):
        value = value.full_tensor()
    return float(value)


def local_value(value: torch.Tensor) -> torch.Tensor:
    """A scalar loss as a plain tensor, left on the device (a loss-parallel loss is a replicated DTensor)."""
    return value.full_tensor() if isinstance(value, DTensor) else value


class Engine:
    def __init__(self, cfg: ParallelConfig, device: torch.device) -> None:
        world = dist.get_world_size() if dist.is_initialized() else 1
        self.cfg, self.device = cfg, device
        self.dims = ParallelDims.from_config(cfg, world)
        self.mesh = self.dims.build_meshes(device.type)  # role -> sub-mesh; None on a single device
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.dp_rank = self.mesh["dp"].get_local_rank() if self.mesh is not None else 0
        self.pp_rank = self.mesh["pp"].get_local_rank() if self.mesh is not None else 0
        self.num_stages = self.dims.pp * cfg.num_stages_per_rank if self.dims.pp > 1 else 1
        self.stage_indices = stage_ids(self.pp_rank, self.dims.pp, cfg.num_stages_per_rank, cfg.pp_schedule) \
            if self.dims.pp > 1 else [0]
        self.schedule = None
        self.tied: TiedEmbeddings | None = None  # pipelined tied embeddings: one copy on each end stage
        self._pp_scale = 1.0

    # ------------------------------------------------------------------------------------------ properties
    @property
    def dp_size(self) -> int:
        return self.dims.dp

    @property
    def pipelined(self) -> bool:
        return self.dims.pp > 1

    @property
    def has_first_stage(self) -> bool:
        return 0 in self.stage_indices

    @property
    def has_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stage_indices

    # --------------------------------------------------------------------------------------- parallelize
    def parallelize(self, model: nn.Module, training: TrainingConfig, loss_fn: Callable | None,
                    microbatches: int, *, frozen: bool = False) -> list[nn.Module]:
        """Split/shard ``model`` into this rank's model parts.

        A model on the meta device (the trainer's) is split and sharded while it costs nothing, then each rank
        allocates and initialises only its own shards from ``training.seed``: the values equal the single-device
        run's whatever the layout, and no rank ever holds the whole model. A materialised model (identical on
        every rank) is split and sharded as it is. ``frozen``: a model that never trains (a DPO reference, a
        reward model): laid out the same, but not wrapped in DDP (it has no gradients to average).
        """
        on_meta = any(p.is_meta for p in model.parameters())
        if self.pipelined:
            parts = split_model(model, self.stage_indices, self.num_stages)  # deep copies: free on meta
            if model.cfg.tie_embeddings:
                self.tied = TiedEmbeddings(parts, self.stage_indices, self.num_stages, self.mesh["pp"],
                                           self._last_stage_rank())
        else:
            parts = [model]
        parts = [self._parallelize_part(part, training) for part in parts]
        if on_meta:
            for part in parts:
                materialize(part, self.device, training.seed)
        if self._uses_ddp and not frozen:
            parts = [apply_ddp(part, self.mesh["dp"]) for part in parts]  # after materialising: DDP broadcasts
        if self.pipelined:
            assert loss_fn is not None
            self.schedule = build_schedule(parts, self.stage_indices, self.num_stages, self.mesh["pp"], self.device,
                                           self.cfg.pp_schedule, microbatches, self._pipeline_loss(loss_fn))
        return parts

    def _parallelize_part(self, part: nn.Module, training: TrainingConfig) -> nn.Module:
        dims = self.dims
        if dims.tp > 1:
            apply_tensor_parallel(part, self.mesh["tp"], self.cfg.sequence_parallel, self.cfg.loss_parallel)
        ac = training.activation_checkpointing
        # Full AC under TP + compile: checkpoint the compiled block (eager checkpointing around it) instead of
        # compiling the checkpointed block, which torch 2.13 cannot run on CPU (see _checkpoint_outside_compile).
        ac_outside = _checkpoint_outside_compile(training, dims.tp)
        if not ac_outside:
            apply_activation_checkpointing(part, ac)
        if training.compile:
            if dims.tp > 1 and part.tok_embeddings is not None:
                part.tok_embeddings.register_forward_hook(_wait_collective_output)
            for block in part.layers.values():
                block.compile()
        if ac_outside:
            apply_activation_checkpointing(part, ac)
        if dims.dp > 1 and not self._uses_ddp:
            dp_mesh = self.mesh["hsdp"] if dims.dp_replicate > 1 else self.mesh["dp_shard"]
            apply_fsdp(part, dp_mesh, training.precision, self.cfg.reshard_after_forward, self.pipelined)
        return part

    def _last_stage_rank(self) -> int:
        cfg, pp = self.cfg, self.dims.pp
        return next(r for r in range(pp)
                    if self.num_stages - 1 in stage_ids(r, pp, cfg.num_stages_per_rank, cfg.pp_schedule))

    @property
    def _uses_ddp(self) -> bool:
        d = self.dims
        return d.dp > 1 and d.dp_shard == 1 and d.tp == 1 and d.pp == 1

    def describe_data_parallel(self) -> str:
        d = self.dims
        if d.dp == 1:
            return "none"
        if d.dp_shard == 1 and d.tp == 1 and d.pp == 1:
            return f"DDP x{d.dp_replicate}"
        if d.dp_replicate > 1:
            return f"HSDP {d.dp_replicate} replicas x {d.dp_shard} shards"
        return f"FSDP2 x{d.dp_shard}"

    # --------------------------------------------------------------------------------------------- steps
    def loss_context(self) -> contextlib.AbstractContextManager:
        return loss_context(self.dims.tp > 1, self.cfg.loss_parallel)

    def set_grad_sync(self, parts: list[nn.Module], enabled: bool) -> None:
        if self.dims.dp > 1:
            set_grad_sync(parts, enabled)

    def _pipeline_loss(self, loss_fn: Callable) -> Callable:
        def scaled(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return loss_fn(output, target) * self._pp_scale

        return scaled

    def pipeline_step(self, batch: dict[str, torch.Tensor], scale: torch.Tensor | float,
                      train: bool = True) -> torch.Tensor:
        """Run the schedule over this rank's batch; returns the summed loss as a device tensor (non-zero on the
        last stage)."""
        assert self.schedule is not None
        self._pp_scale = scale
        target = batch["labels"] if self.has_last_stage else None
        losses: list | None = [] if self.has_last_stage else None
        args = (batch["input_ids"],) if self.has_first_stage else ()
        with self.loss_context():
            if train:
                # return_outputs=False: otherwise the last stage keeps every micro-batch's logits to the end
                self.schedule.step(*args, target=target, losses=losses, return_outputs=False)
                if self.tied is not None:
                    self.tied.sync_grads()  # before clipping: the tied gradient is the sum of both uses
            else:
                self.schedule.eval(*args, target=target, losses=losses)
        # The schedule returns one scaled loss per micro-batch (it may also call loss_fn outside the step while
        # inferring shapes, so the losses list — not the calls — is what counts). Summed on the device: no host
        # read per micro-batch.
        if not losses:
            return torch.zeros((), dtype=torch.float64, device=self.device)
        return torch.stack([local_value(x).detach().double() for x in losses]).sum() / scale

    # -------------------------------------------------------------------------------------- reductions
    def dp_sum(self, value: torch.Tensor | float) -> torch.Tensor:
        """Sum over data-parallel ranks (tensor-parallel peers hold the same value and are not summed).

        A float64 device tensor in and out, never read on the host here: on GPUs the all-reduce is queued on the
        stream, and the caller decides when (if ever) a value is worth a synchronisation.
        """
        t = torch.as_tensor(value, dtype=torch.float64, device=self.device).clone()
        if self.mesh is not None and self.dims.dp > 1:
            dist.all_reduce(t, group=self.mesh["dp"].get_group())
        return t

    def loss_sum(self, local: torch.Tensor | float) -> torch.Tensor:
        """A summed loss over the whole global batch, on every rank (pipelined: from the last stage); a device
        tensor."""
        total = self.dp_sum(local)
        if self.pipelined:
            if not self.has_last_stage:
                total.zero_()
            dist.all_reduce(total, group=self.mesh["pp"].get_group())
        return total

    def clip_grad_norm_(self, parts: list[nn.Module], max_norm: float, grad_scale: float = 1.0) -> torch.Tensor:
        """Unscale (fp16), then clip to the global L2 norm across every shard, replica and stage.

        Returns the pre-clip norm as a float64 device tensor. There is no host-side decision: the clip
        coefficient min(1, max_norm / (norm + 1e-6)) is a tensor and the gradients are always multiplied by it
        (by exactly 1.0 when the norm is below max_norm), so nothing waits for the norm on the host.
        """
        params = [p for part in parts for p in part.parameters() if p.grad is not None]
        _replicate_partial_grads(params)
        # Group by mesh: FSDP-only and FSDP+TP parameters live on different meshes, and neither a norm nor a
        # foreach op can take a mixed list.
        groups: dict[object, list[torch.Tensor]] = {}
        for p in params:
            key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            groups.setdefault(key, []).append(p.grad)
        if grad_scale != 1.0:  # fp16: unscale
            for grads in groups.values():
                torch._foreach_mul_(grads, grad_scale)
        norm_sq = torch.zeros((), dtype=torch.float64, device=self.device)
        duplicates = self.tied.duplicate_grads() if self.tied is not None else set()  # a tied matrix counts once
        for all_grads in groups.values():
            grads = [g for g in all_grads if id(g) not in duplicates]
            if not grads:
                continue
            norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
            norm_sq += norm.double() ** 2
        if self.pipelined:
            dist.all_reduce(norm_sq, group=self.mesh["pp"].get_group())
        total = norm_sq.sqrt()
        if math.isfinite(max_norm):  # a config decision (0 = no clipping), not a data-dependent one
            coef = torch.clamp(max_norm / (total + 1e-6), max=1.0).float()  # () fp32, like the gradients
            for grads in groups.values():  # per group: foreach ops cannot mix DTensors and plain tensors
                torch._foreach_mul_(grads, coef)
        return total


def _replicate_partial_grads(params: list[nn.Parameter]) -> None:
    """Sum each Partial gradient over its mesh dim once, in place of ``.grad``.

    Replicate weights applied to sharded activations (sequence-parallel norms, head-shared q/k norms) get
    Partial gradients. Without FSDP (which reduces them itself) they would stay Partial in ``.grad``, and every
    op that reads them — the grad-norm and each foreach/fused AdamW op — would all-reduce them again: four
    all-reduces of the same tensor per step instead of one.
    """
    for p in params:
        grad = p.grad
        if isinstance(grad, DTensor) and any(pl.is_partial() for pl in grad.placements):
            placements = [Replicate() if pl.is_partial() else pl for pl in grad.placements]
            p.grad = grad.redistribute(grad.device_mesh, placements)


def _checkpoint_outside_compile(training: TrainingConfig, tp: int) -> bool:
    """Whether full activation checkpointing wraps the compiled block rather than being compiled into it.

    Compiled into the block, full AC recomputes scaled_dot_product_attention in backward, an op tagged
    random (its dropout), so AOTAutograd's partitioner saves the RNG state for the recompute
    (``functionalize_rng_ops``). Under TP the block's graph also saves the tensor-parallel DeviceMesh (an
    opaque object), and torch 2.13 appends the RNG state after the opaque objects, where the runtime expects
    tensors: the first forward fails with "expected all tensors_saved_with_vc_check to be Tensors, got ...
    DeviceMesh". Eager checkpointing around the compiled block keeps the same memory behaviour (only the block
    input is kept; backward re-runs the compiled forward) without that graph. Selective AC saves attention's
    output (nothing random is recomputed) and stays inside the compiled region."""
    return training.compile and training.activation_checkpointing == "full" and tp > 1


def _wait_collective_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    """Hand the first compiled block a plain tensor, not the AsyncCollectiveTensor of the embedding's TP
    all-reduce / reduce-scatter (``use_local_output``). Fed to a compiled block, that wrapper's gradient
    comes back as a plain tensor where DTensor's ``Redistribute.backward`` expects a DTensor ("'Tensor'
    object has no attribute '_local_tensor'", torch 2.13). ``* 1.0`` waits for the collective and unwraps,
    keeping the autograd graph."""
    return output * 1.0 if isinstance(output, AsyncCollectiveTensor) else output
