"""Measured memory, for comparison with the planner: counted from the tensors themselves, on any device.

- parameters, gradients and optimizer state: bytes of the *local* tensors of each rank (a DTensor counts its
  local shard), counted right before the optimizer step (gradients) and right after it (parameters, state);
- activations: bytes of the tensor storages created by the forward pass that are still alive when a backward
  pass starts — what autograd saved (``saved_tensors_hooks`` sees the same set: a check in
  tests/test_planner_measure.py), what activation checkpointing keeps (block inputs, the selective policy's
  saved outputs) and what the pipeline schedule holds. The peak over the step's backward starts is reported,
  so pipelined runs show their in-flight micro-batches;
- total: the peak of all live tensor bytes over one training step (parameters, FSDP's gathered parameters,
  gradients, optimizer state, activations, collective and temporary buffers, the pipeline's receive buffers);
- buffers: what that peak is made of beyond the parameters, the optimizer state, and the activations and
  gradients alive at that moment (the storages that turn out to be ``.grad`` at the optimizer step) — a
  decomposition of the peak itself, not the peak minus other kinds' own peaks (those fall at other moments:
  a pipeline's first stage holds its most activations before any gradient exists).

A ``TorchDispatchMode`` sees every op's outputs and tracks their storages by weak reference (storages keep one
Python object each, so a weak reference dies exactly when the memory is freed). Ops that DTensor runs inside
its own dispatch are seen as one DTensor op, whose output's local tensor is tracked.

In a run: ``meshlm train ... --set diagnostics.measure_memory=true`` makes every rank write
``memory_measured.rank<R>.json`` into the run directory after its measured step (the trainer's second step; see
:class:`MemoryProbe`, a trainer callback).
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from meshlm.fileio import atomic_write_text
from meshlm.train.callbacks import TrainerCallback, TrainerView

GIB = 2**30


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2 / TP), the tensor itself otherwise."""
    inner = getattr(t, "_local_tensor", None)
    return inner if inner is not None else t


def tensor_bytes(t: torch.Tensor) -> int:
    t = local(t)
    return t.numel() * t.element_size()


def param_bytes(parts: Iterable[nn.Module]) -> int:
    return sum(tensor_bytes(p) for part in parts for p in part.parameters())


def grad_bytes(parts: Iterable[nn.Module]) -> int:
    return sum(tensor_bytes(p.grad) for part in parts for p in part.parameters() if p.grad is not None)


def optimizer_bytes(optimizers: Iterable[torch.optim.Optimizer]) -> int:
    return sum(tensor_bytes(v) for opt in optimizers for state in opt.state.values() for v in state.values()
               if isinstance(v, torch.Tensor))


def _fsdp_params(parts: Iterable[nn.Module]) -> list[Any]:
    """FSDP2's per-parameter state objects (private API: none if it moved)."""
    out, seen = [], set()
    for part in parts:
        for module in part.modules():
            get_state = getattr(module, "_get_fsdp_state", None)
            if get_state is None:
                continue
            try:
                state = get_state()
                if id(state) in seen:  # fully_shard([norm, output]): the modules of one unit share one state
                    continue
                seen.add(id(state))
                groups = getattr(state, "_fsdp_param_groups", None) or []
                out += [p for group in groups for p in group.fsdp_params]
            except (AttributeError, RuntimeError):
                continue
    return out


def _gathered_params(parts: Iterable[nn.Module]) -> list[torch.Tensor]:
    """FSDP2's unsharded parameters (their storage is resized to 0 between uses). Private API: skipped if it
    moved, which only makes ``buffers`` smaller."""
    params = [getattr(p, "_unsharded_param", None) for p in _fsdp_params(parts)]
    return [local(u) for u in params if u is not None]


def held_grad_bytes(parts: Iterable[nn.Module]) -> int:
    """Gradient bytes this rank holds: the parameters' gradients or, under FSDP2, each parameter's sharded
    gradient plus any unsharded one FSDP2 keeps for a reduction it was told to defer. (FSDP2's state objects,
    not ``parameters()``: while a group is gathered its modules show the unsharded parameters.)"""
    parts = list(parts)
    fsdp_params = _fsdp_params(parts)
    if not fsdp_params:
        return grad_bytes(parts)
    total = 0
    for fsdp_param in fsdp_params:
        unsharded = getattr(fsdp_param, "_unsharded_param", None)
        for g in (getattr(getattr(fsdp_param, "sharded_param", None), "grad", None),
                  getattr(unsharded, "grad", None), getattr(fsdp_param, "unsharded_accumulated_grad", None)):
            if g is not None:
                total += tensor_bytes(g)
    return total


class MemoryMeter(TorchDispatchMode):
    """Live tensor bytes by kind over a region (one training step)."""

    def __init__(self, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer],
                 persistent: Iterable[torch.Tensor] = ()) -> None:
        """``persistent``: tensors allocated before the step and reused by it (the pipeline's receive buffers),
        counted from the start as buffers."""
        super().__init__()
        self._live: dict[str, int] = {"static": 0, "activation": 0, "param_copy": 0, "other": 0}
        self._seen: set[int] = set()
        self._info: dict[int, tuple[int, str, int]] = {}  # storage id -> (serial, kind, bytes) of live storages
        self._serial = 0
        self._grad_serials: set[int] = set()
        self.at_peak: dict[str, Any] = {"activation": 0, "other": {}}
        self._param_storages: set[int] = set()
        self._resizable: list[weakref.ref] = []  # FSDP gathered params: counted at their current size
        self._in_backward = False
        self.forward_open = True  # set False once the optimizer step starts (nothing after it is activation)
        self.peak_total = 0
        self.peak_activations = 0
        self.first_backward_activations: int | None = None
        statics = [p for part in parts for p in part.parameters()] + [b for part in parts for b in part.buffers()]
        statics += [v for opt in optimizers for s in opt.state.values() for v in s.values()
                    if isinstance(v, torch.Tensor)]
        self._params = [p for part in parts for p in part.parameters()]
        for t in statics:
            self._track(local(t), "static")
            self._param_storages.add(id(local(t).untyped_storage()))
        for t in persistent:
            self._track(local(t), "other")
        for t in _gathered_params(parts):
            storage = t.untyped_storage()
            self._param_storages.add(id(storage))
            if id(storage) not in self._seen:
                self._seen.add(id(storage))
                self._resizable.append(weakref.ref(storage))

    def _track(self, t: torch.Tensor, kind: str) -> None:
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._seen or t.device.type == "meta":
            return
        self._seen.add(key)
        nbytes = storage.nbytes()
        self._live[kind] += nbytes
        self._serial += 1
        self._info[key] = (self._serial, kind, nbytes)
        weakref.finalize(storage, self._release, key, kind, nbytes)

    def _release(self, key: int, kind: str, nbytes: int) -> None:
        self._seen.discard(key)
        self._param_storages.discard(key)
        info = self._info.pop(key, None)
        self._live[info[1] if info is not None else kind] -= nbytes  # its kind now (see below), else at creation

    def _gradients_are_not_activations(self) -> None:
        """A storage made in forward that has since become a parameter's .grad is a gradient: the head's fused
        loss makes its weight gradient in forward, and autograd adopts that tensor as .grad when the parameter
        had none (with gradient accumulation it then stays .grad through the next micro-steps)."""
        for p in self._params:
            if p.grad is not None:
                self._not_an_activation(p.grad)

    def _not_an_activation(self, t: torch.Tensor) -> None:
        key = id(local(t).untyped_storage())
        info = self._info.get(key)
        if info is not None and info[1] == "activation":
            serial, _, nbytes = info
            self._live["activation"] -= nbytes
            self._live["other"] += nbytes
            self._info[key] = (serial, "other", nbytes)

    def note_grads(self, grads: Iterable[torch.Tensor]) -> None:
        """Name the storages that are gradients (known only at the optimizer step)."""
        for g in grads:
            info = self._info.get(id(local(g).untyped_storage()))
            if info is not None:
                self._grad_serials.add(info[0])

    def grads_at_peak(self) -> int:
        return sum(n for serial, n in self.at_peak["other"].items() if serial in self._grad_serials)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        in_backward = torch._C._current_graph_task_id() != -1
        if in_backward and not self._in_backward:  # a backward pass starts: what forward left is held for it
            self._gradients_are_not_activations()
            held = self._live["activation"]
            self.peak_activations = max(self.peak_activations, held)
            if self.first_backward_activations is None:
                self.first_backward_activations = held
        self._in_backward = in_backward
        out = func(*args, **kwargs)
        kind = "other"
        if self.forward_open and not in_backward:
            kind = "activation"
            if func is torch.ops.aten._to_copy.default and self._is_param(args[0]):
                kind = "param_copy"  # autocast's low-precision copy of a weight: a buffer, not an activation
            elif getattr(func, "namespace", "") == "fsdp":
                # FSDP2's all-gather input/output buffers: a collective buffer, not an activation. How long one
                # lives depends on when the async collective's work releases it, so counting it as an
                # activation made the figure depend on the machine's load (+ one gathered unit at times). The
                # output buffer is allocated by a plain aten op (torch.empty) before FSDP's copy-in op takes it:
                # whatever an fsdp op takes is a buffer too (its other arguments are parameters and shards).
                kind = "other"
                for t in tree_flatten((args, kwargs))[0]:
                    if isinstance(t, torch.Tensor):
                        self._not_an_activation(t)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(local(t), kind)
        live = self.live_bytes()
        if live > self.peak_total:
            self.peak_total = live
            self.at_peak = {"activation": self._live["activation"],
                            "other": {serial: n for serial, kind, n in self._info.values() if kind == "other"}}
        return out

    def _is_param(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and id(local(t).untyped_storage()) in self._param_storages

    def live_bytes(self) -> int:
        gathered = 0
        for ref in self._resizable:
            storage = ref()
            if storage is not None:
                gathered += storage.nbytes()
        return sum(self._live.values()) + gathered


class MemoryProbe(TrainerCallback):
    """Measures the first measured step of a run (the one the trainer instruments for communication) and writes
    ``memory_measured.rank<R>.json`` per rank; in the run when ``diagnostics.measure_memory`` is on."""

    def __init__(self) -> None:
        self.view: TrainerView | None = None
        self.meter: MemoryMeter | None = None
        self.result: dict[str, Any] = {}
        self._grads: int | None = None
        self._grads_between = 0  # gradient bytes held when a micro-step's forward starts (accumulation)
        self._written = False

    def on_init(self, view: TrainerView) -> None:
        self.view = view
        for opt in view.optimizers:
            opt.register_step_pre_hook(self._before_optimizer)
        for part in view.model_parts:
            part.register_forward_pre_hook(self._before_forward)

    def measure_after(self, view: TrainerView) -> int:
        """The step to measure: the second (as communication is), or the third under DDP, which rebuilds its
        gradient buckets (allocating them, and broadcasting their order) once, in the second step's forward."""
        return 3 if view.engine.describe_data_parallel().startswith("DDP") else 2

    def measuring(self, view: TrainerView) -> MemoryProbe:
        return self

    def on_measured_step(self, view: TrainerView, profiler: Any, comm_stats: dict[str, Any]) -> None:
        if self.result and not self._written:
            self.write(view.run_dir, comm_stats)
            self._written = True

    def _before_forward(self, module, args) -> None:
        if self.meter is not None and self.meter.forward_open:
            self._grads_between = max(self._grads_between, held_grad_bytes(self.view.model_parts))

    def _before_optimizer(self, optimizer, args, kwargs) -> None:
        # Each model part has its own optimizer, and the trainer zeroes a part's gradients right after its
        # step: count them all before the first one.
        if self.meter is not None and self._grads is None:
            self.meter.forward_open = False
            self._grads = grad_bytes(self.view.model_parts)
            self.meter.note_grads(p.grad for part in self.view.model_parts for p in part.parameters()
                                  if p.grad is not None)

    def __enter__(self) -> MemoryProbe:
        view = self.view
        self.meter = MemoryMeter(list(view.model_parts), list(view.optimizers),
                                 pipeline_buffers(view.engine.schedule))
        self.meter.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        meter, self.meter = self.meter, None
        meter.__exit__(*exc)
        parts, opts = self.view.model_parts, self.view.optimizers
        self.result = {
            "params": param_bytes(parts), "grads": self._grads or 0, "optimizer": optimizer_bytes(opts),
            "grads_between_micro_steps": self._grads_between,
            "activations": meter.peak_activations,
            "activations_first_backward": meter.first_backward_activations or 0,
            "total": meter.peak_total,
        }
        known = self.result["params"] + self.result["optimizer"] + meter.at_peak["activation"] + meter.grads_at_peak()
        self.result["buffers"] = max(self.result["total"] - known, 0)

    def write(self, run_dir: Path, comm: dict[str, Any]) -> Path:
        engine = self.view.engine
        record = {"rank": engine.rank, "pp_rank": engine.pp_rank,
                  "coords": mesh_coords(engine), "bytes": self.result,
                  "comm_bytes_per_step": comm.get("comm_bytes_per_step"), "comm": comm.get("comm")}
        path = Path(run_dir) / f"memory_measured.rank{engine.rank}.json"
        atomic_write_text(path, json.dumps(record, indent=1))
        return path


def pipeline_buffers(schedule) -> list[torch.Tensor]:
    """The receive buffers of this rank's pipeline stages (activations in, gradients in): allocated in the first
    step and reused. Private attributes of torch.distributed.pipelining: none if they moved, which only makes
    ``buffers`` smaller."""
    if schedule is None:
        return []
    stages = getattr(schedule, "_stages", None) or [getattr(schedule, "_stage", None)]
    out = []
    for stage in stages:
        for infos in (*getattr(stage, "args_recv_info", {}).values(), *getattr(stage, "grad_recv_info", {}).values()):
            for info in infos if isinstance(infos, tuple) else ():
                buffer = getattr(info, "buffer", None)
                if isinstance(buffer, torch.Tensor) and not getattr(info, "is_root_arg", False):
                    out.append(buffer)
    return out


def mesh_coords(engine) -> dict[str, int]:
    """This rank's coordinate on each mesh dimension (all 0 on a single device)."""
    if engine.mesh is None:
        return {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "tp": 0}
    return {name: engine.mesh[name].get_local_rank() if name in engine.mesh else 0
            for name in ("pp", "dp_shard", "tp")} | {"dp_replicate": engine.dp_rank // engine.dims.dp_shard}


def read_measured(run_dir: Path) -> list[dict[str, Any]]:
    files = sorted(Path(run_dir).glob("memory_measured.rank*.json"),
                   key=lambda p: int(p.stem.split("rank")[-1]))
    return [json.loads(p.read_text()) for p in files]
