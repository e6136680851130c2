"""The trainer's callbacks: hooks called in order with a read-only view, the [diagnostics] switches as config
keys, and a trainer module that imports no diagnostic."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from meshlm.config.loader import config_to_toml, load_config
from meshlm.doctor.callbacks import PeakRss, Profiling, run_callbacks
from meshlm.doctor.oom import OomReport
from meshlm.doctor.parity_checks import ParityProbe
from meshlm.planner.measure import MemoryProbe
from meshlm.planner.runlog import PlanLog
from meshlm.train.callbacks import TrainerCallback
from meshlm.train.run_dir import init_run_dir
from meshlm.train.trainer import Trainer
from helpers import meshlm

QUIET = ["data.seq_len=32", "training.batch_size=4", "training.steps=3", "training.eval_interval=0",
         "checkpoint.enabled=false", "metrics.interval=1", "metrics.tensorboard=false", "metrics.progress=plain"]


class Recorder(TrainerCallback):
    """Notes each call and what the view showed at that moment."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def measure_after(self, view):
        return 2

    def on_init(self, view):
        self.calls.append(("init", view.step))
        self.parts = len(view.model_parts)

    def on_train_start(self, view):
        self.calls.append(("start", view.step))
        return "recorder: started"

    def on_measured_step(self, view, profiler, comm_stats):
        self.calls.append(("measured", view.step))
        self.measured_keys = set(comm_stats)

    def on_step_end(self, view, record):
        self.calls.append(("step", view.step))

    def on_train_end(self, view):
        self.calls.append(("end", view.step))
        return "recorder: ended"


def _trainer(dataset, tmp_path, callbacks, *overrides):
    cfg = load_config(None, [f'data.path="{dataset}"', *QUIET, *overrides])
    init_run_dir(tmp_path / "run", config_to_toml(cfg), resume=False)
    return Trainer(cfg, tmp_path / "run", callbacks=callbacks)


def test_hooks_run_in_order_with_a_read_only_view(debug_dataset, tmp_path, capsys):
    recorder = Recorder()
    trainer = _trainer(debug_dataset, tmp_path, [recorder])
    trainer.train()
    # a single device samples no step unless a callback asks: this one asked for the 2nd
    assert recorder.calls == [("init", 0), ("start", 0), ("step", 1), ("measured", 2), ("step", 2), ("step", 3),
                              ("end", 3)]
    assert recorder.parts == 1 and {"comm_share", "measured_step_s"} <= recorder.measured_keys
    out = capsys.readouterr().out
    assert "recorder: started" in out and "recorder: ended" in out
    view = trainer.callbacks.view
    with pytest.raises(AttributeError):
        view.step = 7  # the view has no setters
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[1]["comm_measured_step"] == 2


def test_without_callbacks_one_device_samples_nothing(debug_dataset, tmp_path):
    _trainer(debug_dataset, tmp_path, []).train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3] and not any("comm_measured_step" in r for r in records)
    assert not (tmp_path / "run" / "plan_prediction.json").exists()  # the planner's log is a callback


def test_diagnostics_switches_build_their_callbacks(tmp_path):
    def kinds(*overrides):
        return [type(c) for c in run_callbacks(load_config(None, list(overrides)))]

    assert kinds() == [PlanLog, OomReport]
    assert kinds("diagnostics.measure_memory=true", "diagnostics.parity_probe=true", "diagnostics.peak_rss=true",
                 f'diagnostics.trace_dir="{tmp_path}"') == [PlanLog, OomReport, MemoryProbe, ParityProbe, Profiling,
                                                           PeakRss]
    assert kinds("diagnostics.profile=true")[-1] is Profiling


def test_peak_rss_and_traces_are_written_by_their_switches(debug_dataset, tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    cfg = load_config(None, [f'data.path="{debug_dataset}"', *QUIET, "diagnostics.peak_rss=true",
                             f'diagnostics.trace_dir="{traces}"'])
    init_run_dir(tmp_path / "run", config_to_toml(cfg), resume=False)
    Trainer(cfg, tmp_path / "run", callbacks=run_callbacks(cfg)).train()
    peak = json.loads((tmp_path / "run" / "peak_rss" / "rank-00000.json").read_text())
    assert peak["rank"] == 0 and peak["peak_rss_bytes"] > 50 * 2**20  # torch alone takes more
    # the profiled steps of a 3-step run with comm_sample_interval 50: the 2nd only
    assert sorted(p.name for p in traces.iterdir()) == ["trace.rank0.step2.json"]
    assert json.loads((tmp_path / "run" / "plan_prediction.json").read_text())["measured"]["step_time_s"] > 0


def test_config_keys_show_the_diagnostics_section():
    out = meshlm("config", "keys").stdout
    for key in ("diagnostics.measure_memory", "diagnostics.parity_probe", "diagnostics.profile",
                "diagnostics.trace_dir", "diagnostics.peak_rss"):
        assert key in out


def test_the_trainer_imports_no_diagnostic():
    code = ("import sys, meshlm.train.trainer; "
            "print(sorted(m for m in sys.modules if m.startswith(('meshlm.planner', 'meshlm.doctor'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
