"""Communication accounting, counted from the collectives the process groups actually run.

Every c10d collective (FSDP2's all-gather / reduce-scatter, DDP's all-reduce, pipeline send/recv) and every
functional collective (DTensor's tensor-parallel all-reduce / all-gather / reduce-scatter) passes through the
dispatcher as a ``c10d::*`` or ``_c10d_functional::*`` op. A TorchDispatchMode sees each call with its real
tensors, so bytes and calls per collective type are measured, not derived from formulas.

Collectives that DTensor issues *inside* its own op dispatch — the loss-parallel cross-entropy reductions, the
all-reduce of a Partial gradient (sequence-parallel norm weights, reduced again by every op that reads them: the
grad-norm and each optimizer op), the gradient-norm reduction — would run while the mode is switched off (a mode
is inactive inside its own handler). So the counter declines ops on DTensors (returns NotImplemented): DTensor
then runs its dispatch with the mode still on the stack, and every collective it issues on plain tensors reaches
the counter, exactly once. They are kept apart (``comm_dtensor*``; a collective is DTensor's when DTensor's op
dispatcher or a loss-parallel handler is on the Python stack): ``comm_bytes_per_step`` stays what the engine's
own plan issues — FSDP, DDP, the TP/SP layout changes, pipeline send/recv, the trainer's reductions — which the
planner predicts byte for byte; the sum of both is everything that went over the wire.

Bytes are the *payload*: the full (unsharded) buffer of an all-gather or reduce-scatter, the tensor of an
all-reduce / broadcast / send / recv. Bytes on the wire follow from it by the ring factors (all-reduce
2(n−1)/n, all-gather and reduce-scatter (n−1)/n); ``wire_bytes`` applies them with each call's group size.

Communication time is measured with the profiler on the same step: the backend's own events (``gloo:*`` on
CPU threads, NCCL kernels on GPUs). Their sum over the step time is ``comm_share`` — the time collectives
were running, an upper bound on the exposed share when they overlap compute.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import defaultdict
from typing import Any, Iterator

import torch
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

# dispatcher op name -> collective type
_OPS: dict[str, str] = {
    "allreduce_": "all_reduce", "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
    "_allgather_base_": "all_gather", "allgather_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "broadcast_": "broadcast", "broadcast": "broadcast",
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
    "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all",
}
# Subclasses whose dispatch may issue collectives. Others (FakeTensor, which DTensor's sharding propagation runs
# under) are handled as before: declining them would leave no handler for the op.
_COLLECTIVE_SUBCLASSES = (DTensor, AsyncCollectiveTensor)
# DTensor's op dispatcher, and the loss-parallel op handlers (called straight from C++ dispatch)
_DTENSOR_DISPATCH = (os.path.join("torch", "distributed", "tensor", "_dispatch.py"),
                     os.path.join("torch", "distributed", "tensor", "parallel", "loss.py"))
_RING = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    return []


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class CommCounter(TorchDispatchMode):
    """Counts calls and payload bytes per collective type while active: ``calls``/``bytes``/``wire_bytes`` for
    the engine's collectives, ``dtensor_calls``/``dtensor_bytes`` for those DTensor runs inside its op dispatch."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)
        self.wire_bytes: dict[str, float] = defaultdict(float)
        self.dtensor_calls: dict[str, int] = defaultdict(int)
        self.dtensor_bytes: dict[str, int] = defaultdict(int)
        self.dtensor_wire_bytes: dict[str, float] = defaultdict(float)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, _COLLECTIVE_SUBCLASSES) for t in types):
            return NotImplemented  # let DTensor (or a collective's async wrapper) unwrap; see the module doc
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace in ("c10d", "_c10d_functional"):
            kind = _OPS.get(func._opname)
            if kind is not None:
                self._record(kind, func._opname, args, out)
        return out

    def _record(self, kind: str, opname: str, args: tuple, out: Any) -> None:
        if opname in ("all_gather_into_tensor", "all_gather_into_tensor_coalesced"):
            payload = _nbytes(_tensors(out))  # functional all-gather returns the gathered buffer
        elif opname in ("_reduce_scatter_base_", "reduce_scatter_", "reduce_scatter_tensor_coalesced_"):
            payload = _nbytes(_tensors(args[1]))  # (output, input, ...): the full input is the payload
        else:
            payload = _nbytes(_tensors(args[0]))  # the tensor(s) reduced / gathered into / sent
        ring = _RING.get(kind)
        n = _group_size(args)
        wire = payload * (ring(n) if ring and n > 1 else 1.0)
        if _inside_dtensor_dispatch():
            calls, sizes, wires = self.dtensor_calls, self.dtensor_bytes, self.dtensor_wire_bytes
        else:
            calls, sizes, wires = self.calls, self.bytes, self.wire_bytes
        calls[kind] += 1
        sizes[kind] += payload
        wires[kind] += wire

    def summary(self) -> dict[str, Any]:
        return {
            "comm_bytes_per_step": int(sum(self.bytes.values())),
            "comm_calls_per_step": int(sum(self.calls.values())),
            "comm_wire_bytes_per_step": int(sum(self.wire_bytes.values())),
            "comm": {k: {"calls": self.calls[k], "bytes": self.bytes[k]} for k in sorted(self.calls)},
            "comm_dtensor_bytes_per_step": int(sum(self.dtensor_bytes.values())),
            "comm_dtensor_calls_per_step": int(sum(self.dtensor_calls.values())),
            "comm_dtensor_wire_bytes_per_step": int(sum(self.dtensor_wire_bytes.values())),
            "comm_dtensor": {k: {"calls": self.dtensor_calls[k], "bytes": self.dtensor_bytes[k]}
                             for k in sorted(self.dtensor_calls)},
        }


def _inside_dtensor_dispatch() -> bool:
    """True when DTensor's op dispatcher (or a loss-parallel op handler) is on the Python stack: a collective
    it issues for an op; false for the engine's own calls and the TP plan's explicit ``redistribute`` hooks."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_DTENSOR_DISPATCH):
            return True
        frame = frame.f_back
    return False


def _group_size(args: tuple) -> int:
    """Size of the op's process group: a ProcessGroup argument (c10d ops) or a group name (functional ops)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in args:
        if isinstance(a, dist.ProcessGroup):
            return a.size()
        if isinstance(a, torch.ScriptObject):  # c10d ops receive the group boxed
            try:
                return dist.ProcessGroup.unbox(a).size()
            except (RuntimeError, TypeError):
                continue
    if isinstance(args[-1], str):
        try:
            return _resolve_process_group(args[-1]).size()
        except (RuntimeError, ValueError, KeyError):
            return 0
    return 0


def comm_time_from_profile(prof) -> float:
    """Seconds the backend spent running collectives during a profiled region."""
    total_us = 0.0
    for event in prof.events():
        name = event.name
        if name.startswith("gloo:") or "nccl" in name.lower():
            total_us += event.cpu_time_total if name.startswith("gloo:") else event.device_time_total
    return total_us / 1e6


@contextlib.contextmanager
def silence_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null (C++ libraries print there directly, bypassing sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(devnull)
        os.close(saved)
