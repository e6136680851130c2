"""Per-step metrics: ``metrics.jsonl`` (the contract), the trackers beside it (meshlm/train/tracking.py:
TensorBoard, MLflow, W&B), and a terminal view."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from typing import Any

import torch

from meshlm.fileio import atomic_write_text
from meshlm.config.schema import MetricsConfig
from meshlm.train.tracking import Trackers, check_trackers


_STATUS, _CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")
_lifetime_peak_kib = 0  # the process's peak RSS across interval resets (resetting lowers ru_maxrss too)


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])  # "VmHWM:   123456 kB"
    raise OSError(f"{field} missing from {_STATUS}")


def process_peak_rss_bytes() -> int:
    """Peak resident set size of this process over its whole life, interval resets included."""
    return 1024 * max(_lifetime_peak_kib, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # Linux: KiB


class IntervalMemory:
    """Peak memory since the previous reading: each metrics record reports its own logging interval's peak.

    CUDA: peak allocated bytes, reset with ``torch.cuda.reset_peak_memory_stats``. CPU (Linux): the peak RSS
    ``VmHWM``, reset by writing "5" to ``/proc/self/clear_refs``. Where that reset is refused, the current RSS
    is reported instead, and ``kind`` says which one the records carry.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            self.kind = "interval_peak_allocated"
            torch.cuda.reset_peak_memory_stats(device)  # the first interval starts here, after set-up
        elif self._reset_rss():
            self.kind = "interval_peak_rss"
        else:
            self.kind = "current_rss" if _STATUS.is_file() else "process_peak_rss"

    def read_and_reset(self) -> float:
        """GiB: this interval's peak (or the current / lifetime figure ``kind`` names); starts a new interval."""
        global _lifetime_peak_kib
        if self.kind == "interval_peak_allocated":
            peak = torch.cuda.max_memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return peak / 2**30
        if self.kind == "process_peak_rss":
            return process_peak_rss_bytes() / 2**30
        kib = _status_kib("VmHWM" if self.kind == "interval_peak_rss" else "VmRSS")
        _lifetime_peak_kib = max(_lifetime_peak_kib, _status_kib("VmHWM"))
        if self.kind == "interval_peak_rss":
            self._reset_rss()
        return kib / 2**20

    @staticmethod
    def _reset_rss() -> bool:
        global _lifetime_peak_kib
        try:
            _lifetime_peak_kib = max(_lifetime_peak_kib, _status_kib("VmHWM"))
            _CLEAR_REFS.write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0, own process)
            return True
        except OSError:
            return False


def gather_rank_floats(values: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's ``values`` (one all-gather of a few floats; the ranks call it at the same log steps), in rank
    order; ``[values]`` without a process group."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [list(values)]
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return torch.stack(out).tolist()


def optimizer_time_from_profile(prof) -> float:
    """Seconds in ``optimizer.step()`` during a profiled region (torch.optim labels each step
    ``Optimizer.step#<class>.step``): host time on CPU, kernel time on GPUs."""
    total_us = 0.0
    for event in prof.events():
        if event.name.startswith("Optimizer.step#"):
            total_us += event.device_time_total or event.cpu_time_total
    return total_us / 1e6


def truncate_metrics(path: Path, after_step: int) -> None:
    """Drop records past ``after_step`` (logged by a run that crashed before its next checkpoint)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= after_step:
                kept.append(line)
        except ValueError:
            continue  # a line cut short by a crash
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def format_record(rec: dict[str, Any], total_steps: int) -> str:
    parts = [f"step {rec['step']}/{total_steps}", f"loss {rec['loss']:.4f}"]
    if "eval_loss" in rec:
        parts.append(f"eval {rec['eval_loss']:.4f}")
    parts += [f"lr {rec['lr']:.2e}", f"gnorm {rec['grad_norm']:.3f}", f"{rec['tokens_per_s']:,.0f} tok/s",
              f"mfu {100 * rec['mfu']:.2f}%" if rec["mfu"] == rec["mfu"] else "mfu n/a"]
    return " | ".join(parts)


class MetricsLogger:
    """Writes one JSON object per logged step; only rank 0 writes."""

    def __init__(self, run_dir: Path, cfg: MetricsConfig, total_steps: int, start_step: int, rank: int = 0) -> None:
        self.enabled = rank == 0
        self.total_steps = total_steps
        self.path = Path(run_dir) / "metrics.jsonl"
        self._trackers = None
        self._progress = None
        check_trackers(cfg)  # on every rank, so that all of them stop on a missing package
        if not self.enabled:
            return
        truncate_metrics(self.path, start_step)
        self._file = self.path.open("a", encoding="utf-8")
        self._trackers = Trackers(Path(run_dir), cfg, start_step)
        use_rich = cfg.progress == "rich" or (cfg.progress == "auto" and sys.stdout.isatty())
        if use_rich:
            self._progress = _RichProgress(total_steps, start_step)

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self._trackers.log(record)
        line = format_record(record, self.total_steps)
        if self._progress is not None:
            self._progress.update(record["step"], line)
        else:
            print(line, flush=True)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.console.print(text)
        else:
            print(text, flush=True)

    def advance(self, step: int) -> None:
        if self._progress is not None:
            self._progress.update(step, None)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        self._trackers.close()
        if self._progress is not None:
            self._progress.stop()


class _RichProgress:
    def __init__(self, total: int, start: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                             TextColumn("{task.fields[info]}"))
        self.console = self._bar.console
        self._task = self._bar.add_task("train", total=total, completed=start, info="")
        self._bar.start()

    def update(self, step: int, line: str | None) -> None:
        if line is not None:
            self._bar.update(self._task, completed=step, info=line.split(" | ", 1)[1])
        else:
            self._bar.update(self._task, completed=step)

    def stop(self) -> None:
        self._bar.stop()
