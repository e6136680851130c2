"""The standard callbacks of a training run, built from its config: the planner's prediction log, the
out-of-memory report, and whichever ``[diagnostics]`` switches are on. The CLI (and every command that trains)
passes them to the Trainer, which imports no diagnostic itself (meshlm/train/callbacks.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshlm.config.schema import JobConfig
from meshlm.doctor.oom import OomReport
from meshlm.doctor.parity_checks import ParityProbe
from meshlm.fileio import atomic_write_text
from meshlm.planner.measure import MemoryProbe
from meshlm.planner.runlog import PlanLog
from meshlm.train.callbacks import TrainerCallback, TrainerView
from meshlm.train.metrics import process_peak_rss_bytes


class Profiling(TrainerCallback):
    """Sampled (counted and profiled) steps on a single device too; with ``trace_dir``, a chrome trace of each."""

    def __init__(self, trace_dir: str = "") -> None:
        self.trace_dir = trace_dir

    def measure_after(self, view: TrainerView) -> int:
        return 2  # the process's 2nd step, as multi-rank sampling does

    def on_measured_step(self, view: TrainerView, profiler: Any, comm_stats: dict[str, Any]) -> None:
        if self.trace_dir:
            profiler.export_chrome_trace(str(Path(self.trace_dir) / f"trace.rank{view.rank}.step{view.step}.json"))


class PeakRss(TrainerCallback):
    """At the end of training, this process's lifetime peak resident set size in RUN_DIR/peak_rss/rank-XXXXX.json.

    For memory benchmarks (scripts/bench_scale_memory.py): the peak over the whole process, initialisation
    included, which tensor counting does not see. Not ru_maxrss: the metrics' per-interval memory resets the
    kernel's peak, and process_peak_rss_bytes keeps the lifetime peak across those resets.
    """

    def on_train_end(self, view: TrainerView) -> None:
        folder = Path(view.run_dir) / "peak_rss"
        folder.mkdir(parents=True, exist_ok=True)
        record = {"rank": view.rank, "peak_rss_bytes": process_peak_rss_bytes()}
        atomic_write_text(folder / f"rank-{view.rank:05d}.json", json.dumps(record))
        return None


def run_callbacks(cfg: JobConfig) -> list[TrainerCallback]:
    """What every training run reports (the planner's prediction, the out-of-memory line) and what
    ``cfg.diagnostics`` turns on."""
    diag = cfg.diagnostics
    out: list[TrainerCallback] = [PlanLog(), OomReport()]
    if diag.measure_memory:
        out.append(MemoryProbe())
    if diag.parity_probe:
        out.append(ParityProbe())
    if diag.profile or diag.trace_dir:
        out.append(Profiling(diag.trace_dir))
    if diag.peak_rss:
        out.append(PeakRss())
    return out
