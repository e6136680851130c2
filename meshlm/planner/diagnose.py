"""``meshlm diagnose memory CONFIG [--nproc N]``: the planner's memory and communication prediction for a
config, beside what one training step of it measures (meshlm/planner/measure.py)."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from meshlm.cli.jsonout import emit
from meshlm.planner.memory import GIB, KEYS

MEASURE_OVERRIDES = ["training.steps=3", "checkpoint.enabled=false", "training.eval_interval=0",
                     "metrics.interval=1", "metrics.tensorboard=false", "metrics.progress=plain"]
ROWS = (*KEYS, "total")


def add_memory_parser(dsub, add_config_args) -> None:
    p = dsub.add_parser("memory", help="predicted vs measured memory per device (params, grads, optimizer, "
                                       "activations, buffers) and collective bytes per step")
    add_config_args(p)
    p.add_argument("--nproc", type=int, default=1, help="ranks of the layout (default 1: this process)")
    p.add_argument("--work-dir", help="keep the measured run here (default: a temporary folder)")
    p.add_argument("--json", action="store_true", help="print {predicted, measured, ranks}")
    p.set_defaults(handler=run_memory)


def measure_config(config: str | None, overrides: list[str], nproc: int, work: Path) -> list[dict[str, Any]]:
    """Train the config for a few steps with memory measurement on; the per-rank records."""
    from meshlm.config.loader import config_to_toml, load_config
    from meshlm.distributed.launch import launch_local
    from meshlm.planner.measure import ENV, read_measured
    from meshlm.train.run_dir import init_run_dir
    from meshlm.train.trainer import Trainer

    overrides = [*overrides, *MEASURE_OVERRIDES]
    cfg = load_config(config, overrides)
    run_dir = work / "run"
    init_run_dir(run_dir, config_to_toml(cfg), resume=False)
    old = os.environ.get(ENV)
    os.environ[ENV] = "1"
    try:
        if nproc > 1:
            worker = ["train", *([config] if config else []), *[a for o in overrides for a in ("--set", o)],
                      "--run-dir", str(run_dir), "--resume", "auto"]
            launch_local(nproc, 0, worker, cfg.parallel.timeout_s)
        else:
            Trainer(cfg, run_dir).train()
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old
    return read_measured(run_dir)


def compare(config: str | None, overrides: list[str], nproc: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    from meshlm.config.loader import load_config
    from meshlm.planner.predict import layout_from_config, predict_rank

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


def run_memory(args: argparse.Namespace) -> int:
    from meshlm.errors import ConfigError

    if args.nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {args.nproc}")
    with tempfile.TemporaryDirectory(prefix="meshlm-memory-") as tmp:
        work = Path(args.work_dir or tmp)
        records = measure_config(args.config, args.overrides, args.nproc, work)
        if not records:
            raise ConfigError(f"no memory measurement came back from the run in {work}")
        report = compare(args.config, args.overrides, args.nproc, records)
    if args.json:
        emit(report)
        return 0
    print(f"memory of {report['layout']} ({args.nproc} rank(s)): predicted vs measured, MiB per rank")
    print(f"{'rank':>4} {'':12}" + "".join(f"{k:>14}" for k in (*ROWS, "comm bytes")))
    for r in report["ranks"]:
        for label, key in (("predicted", "predicted_bytes"), ("measured", "measured_bytes")):
            vals = r[key]
            cells = "".join(f"{vals.get(k, 0) / 2**20:>14.3f}" for k in ROWS)
            print(f"{r['rank']:>4} {label:12}{cells}{vals.get('comm_bytes_per_step', 0):>14,}")
    print("params/grads/optimizer are counted from local tensors; activations = forward-created storages alive "
          "when backward starts; measured buffers = peak live bytes minus the rest (docs/planner.md)")
    return 0
