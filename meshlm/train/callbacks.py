"""The trainer's callback interface: what diagnostics (the planner's prediction log, the memory and parity
probes, the out-of-memory report, traces) may see of a run and when they are called.

The trainer imports no diagnostic: its caller passes the callbacks (``meshlm.doctor.callbacks.run_callbacks``
builds the standard set from the config's ``[diagnostics]`` section). A callback reads the run through a
:class:`TrainerView` — the public, read-only facts of the run — never the trainer's own attributes, so the
trainer can change inside without breaking them.

Order of calls in ``Trainer.train()``::

    on_train_start(view) -> message line | None      (after the run's description is logged)
    each step:  [measured steps only]  measuring(view) wraps the step (first measured step only);
                                       on_measured_step(view, profiler, comm_stats) after it
                on_step_end(view, record)
                on_oom(view, exc) -> exception | None  (a step ran out of memory; the first answer is raised)
    on_train_end(view) -> message line | None        (after the last step, before the logger closes)

``on_init(view)`` runs at the end of ``Trainer.__init__``, when the model, optimizers and loaders exist.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, ContextManager, Sequence

if TYPE_CHECKING:  # torch stays unimported here: `meshlm diagnose oom` plans without it
    import torch
    from torch import nn

    from meshlm.config.schema import JobConfig
    from meshlm.distributed.engine import Engine
    from meshlm.objectives.base import Objective
    from meshlm.train.trainer import Trainer


class TrainerView:
    """What a callback may read of a run: read-only properties over the trainer."""

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer

    @property
    def cfg(self) -> JobConfig:
        return self._trainer.cfg

    @property
    def run_dir(self) -> Path:
        return self._trainer.run_dir

    @property
    def device(self) -> torch.device:
        return self._trainer.device

    @property
    def rank(self) -> int:
        return self._trainer.rank

    @property
    def engine(self) -> Engine:
        return self._trainer.engine

    @property
    def model_parts(self) -> Sequence[nn.Module]:
        return tuple(self._trainer.model_parts)

    @property
    def optimizers(self) -> Sequence[torch.optim.Optimizer]:
        return tuple(self._trainer.optimizers)

    @property
    def objective(self) -> Objective:
        """The run's objective: read its declared costs (``sequences_per_row``, ``frozen_forwards``), not its
        state."""
        return self._trainer.objective

    @property
    def train_loader(self) -> Any:
        return self._trainer.train_loader

    @property
    def step(self) -> int:
        """Optimizer steps done so far (the step being run is ``step + 1``)."""
        return self._trainer.step

    @property
    def peak_flops(self) -> float:
        """The device's peak FLOP/s the run's MFU is computed against."""
        return self._trainer.peak_flops


class TrainerCallback:
    """A no-op for every hook: a callback overrides only the hooks it needs."""

    def measure_after(self, view: TrainerView) -> int | None:
        """Ask for an instrumented ("measured") step this many steps after the process starts (the trainer takes
        the largest answer; 2 when only multi-rank sampling asks); None: no request."""
        return None

    def on_init(self, view: TrainerView) -> None:
        """Once, when the model, optimizers and loaders exist (before any step)."""

    def on_train_start(self, view: TrainerView) -> str | None:
        """A line to log when training starts, or None."""
        return None

    def measuring(self, view: TrainerView) -> ContextManager[Any]:
        """A context wrapping the process's first measured step (the memory probe measures inside it)."""
        return contextlib.nullcontext()

    def on_measured_step(self, view: TrainerView, profiler: Any, comm_stats: dict[str, Any]) -> None:
        """After each measured step: its ``torch.profiler.profile`` and the communication figures."""

    def on_step_end(self, view: TrainerView, record: dict[str, Any]) -> None:
        """After every optimizer step, with its record (device tensors: read them only if you must)."""

    def on_oom(self, view: TrainerView, exc: BaseException) -> BaseException | None:
        """A step ran out of memory: return the exception to raise instead (the first non-None wins)."""
        return None

    def on_train_end(self, view: TrainerView) -> str | None:
        """A line to log when training ends (after the last step), or None."""
        return None


class Callbacks:
    """The run's callbacks, called in order."""

    def __init__(self, callbacks: Sequence[TrainerCallback], view: TrainerView) -> None:
        self.items, self.view = list(callbacks), view

    def measure_after(self) -> int | None:
        asks = [n for n in (c.measure_after(self.view) for c in self.items) if n is not None]
        return max(asks) if asks else None

    def on_init(self) -> None:
        for c in self.items:
            c.on_init(self.view)

    def messages(self, hook: str) -> list[str]:
        """The non-empty lines ``on_train_start`` / ``on_train_end`` returned."""
        lines = [getattr(c, hook)(self.view) for c in self.items]
        return [line for line in lines if line]

    def measuring(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for c in self.items:
            stack.enter_context(c.measuring(self.view))
        return stack

    def on_measured_step(self, profiler: Any, comm_stats: dict[str, Any]) -> None:
        for c in self.items:
            c.on_measured_step(self.view, profiler, comm_stats)

    def on_step_end(self, record: dict[str, Any]) -> None:
        for c in self.items:
            c.on_step_end(self.view, record)

    def on_oom(self, exc: BaseException) -> BaseException | None:
        for c in self.items:
            replacement = c.on_oom(self.view, exc)
            if replacement is not None:
                return replacement
        return None


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA/ROCm/MPS out-of-memory errors and the CPU allocator's failure (a plain RuntimeError)."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())
