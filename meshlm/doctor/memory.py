"""``meshlm diagnose memory CONFIG [--nproc N]``: the planner's memory and communication prediction for a
config, beside what one training step of it measures (meshlm/planner/measure.py's probe, switched on by
``diagnostics.measure_memory`` in the run's own config, so every rank of a multi-rank run measures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshlm.config.loader import config_to_toml, load_config
from meshlm.distributed.launch import launch_local
from meshlm.doctor.callbacks import run_callbacks
from meshlm.planner.measure import read_measured
from meshlm.planner.memory import GIB, KEYS
from meshlm.planner.predict import layout_from_config, predict_rank
from meshlm.train.run_dir import init_run_dir
from meshlm.train.trainer import Trainer

MEASURE_OVERRIDES = ["training.steps=3", "checkpoint.enabled=false", "training.eval_interval=0",
                     "metrics.interval=1", "metrics.tensorboard=false", "metrics.progress=plain",
                     "diagnostics.measure_memory=true"]
ROWS = (*KEYS, "total")


def measure_config(config: str | None, overrides: list[str], nproc: int, work: Path) -> list[dict[str, Any]]:
    """Train the config for a few steps with memory measurement on; the per-rank records."""
    overrides = [*overrides, *MEASURE_OVERRIDES]
    cfg = load_config(config, overrides)
    run_dir = work / "run"
    init_run_dir(run_dir, config_to_toml(cfg), resume=False)
    if nproc > 1:
        worker = ["train", *([config] if config else []), *[a for o in overrides for a in ("--set", o)],
                  "--run-dir", str(run_dir), "--resume", "auto"]
        launch_local(nproc, 0, worker, cfg.parallel.timeout_s)
    else:
        Trainer(cfg, run_dir, callbacks=run_callbacks(cfg)).train()
    return read_measured(run_dir)


def compare(config: str | None, overrides: list[str], nproc: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    cfg = load_config(config, overrides)
    spec, layout, training = layout_from_config(cfg, nproc)
    ranks = []
    for rec in records:
        pred = predict_rank(spec, layout, training, rec["coords"])
        measured = {**rec["bytes"], "comm_bytes_per_step": rec.get("comm_bytes_per_step") or 0,
                    "comm": rec.get("comm") or {}}
        ranks.append({"rank": rec["rank"], "coords": rec["coords"], "predicted_bytes": pred,
                      "measured_bytes": measured})
    top = ranks[0] if ranks else {"predicted_bytes": {}, "measured_bytes": {}}
    return {"layout": layout.describe(), "nproc": nproc,
            "predicted": _gib(top["predicted_bytes"]), "measured": _gib(top["measured_bytes"]), "ranks": ranks}


def _gib(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: values[k] / GIB for k in ROWS if k in values}
    out["comm_bytes_per_step"] = int(values.get("comm_bytes_per_step") or 0)
    return out
