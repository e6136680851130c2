"""Running a sweep: every point an ordinary run directory, resumable, summarised in ``points.jsonl``.

Layout of ``--run-dir DIR``::

    DIR/points/<name>/            an ordinary `meshlm train` run directory (config, metrics, checkpoints)
    DIR/points/<name>/point.json  the point's overrides, written before it trains (identifies the point)
    DIR/points/<name>/result.json its row, written atomically once trained and evaluated: "finished"
    DIR/points.jsonl              one row per finished point, in sweep order (rewritten after each point)

On a rerun a finished point is skipped; a started one (run directory without result.json) continues from its
newest valid checkpoint, exactly as ``meshlm train --resume auto`` would; a point whose directory holds other
settings is refused rather than mixed. Single-process points train in this process; ``--nproc N`` launches
``meshlm train --nproc N --resume auto`` for each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

from meshlm.config.loader import config_to_toml, load_config
from meshlm.doctor.callbacks import run_callbacks
from meshlm.errors import CheckpointError, ConfigError
from meshlm.fileio import atomic_write_text
from meshlm.plots import plot_loss, read_metrics
from meshlm.scaling.heldout import heldout_loss
from meshlm.scaling.rows import POINTS_FILE
from meshlm.scaling.spec import Point, SweepSpec
from meshlm.train.run_dir import init_run_dir
from meshlm.train.trainer import Trainer

POINT_FILE, RESULT_FILE = "point.json", "result.json"


def point_dir(sweep_dir: Path, point: Point) -> Path:
    return Path(sweep_dir) / "points" / point.name


def point_status(sweep_dir: Path, point: Point) -> str:
    """"finished", "started" (a run directory exists, no result yet) or "new"."""
    folder = point_dir(sweep_dir, point)
    if (folder / RESULT_FILE).is_file():
        return "finished"
    return "started" if folder.exists() else "new"


def _identity(spec: SweepSpec, point: Point) -> dict:
    return {"name": point.name, "base": str(spec.base), "overrides": point.overrides}


def _claim(spec: SweepSpec, folder: Path, point: Point) -> None:
    """Make ``folder`` the point's run directory (config.resolved.toml, then point.json), or check that it
    already is: a folder of another point, another model or an unrelated one is refused."""
    ident = _identity(spec, point)
    marker = folder / POINT_FILE
    if marker.is_file():
        old = json.loads(marker.read_text())
        if old.get("overrides") != ident["overrides"]:
            raise CheckpointError(f"{folder} was run with other settings ({' '.join(old.get('overrides', []))}); "
                                  "delete that folder to rerun the point, or use another --run-dir")
    # resume=True: an existing run directory of the same model is continued; another model or files are refused
    init_run_dir(folder, config_to_toml(load_config(spec.base, point.overrides)), resume=True)
    if not marker.is_file():
        atomic_write_text(marker, json.dumps(ident, indent=1))


def _train_here(spec: SweepSpec, point: Point, folder: Path) -> None:
    cfg = load_config(spec.base, point.overrides)
    Trainer(cfg, folder, resume=True, callbacks=run_callbacks(cfg)).train()  # no checkpoint yet: starts at step 0
    plot_loss(folder)


def _train_ranks(spec: SweepSpec, point: Point, folder: Path, nproc: int) -> None:
    cmd = [sys.executable, "-m", "meshlm", "train", str(spec.base), *[a for o in point.overrides for a in ("--set", o)],
           "--run-dir", str(folder), "--resume", "auto", "--nproc", str(nproc)]
    code = subprocess.call(cmd)
    if code != 0:
        raise CheckpointError(f"point {point.name}: `meshlm train` exited with {code} (log above); rerun the sweep "
                              "to resume it")


def result_row(spec: SweepSpec, point: Point, folder: Path) -> dict:
    """Evaluate the trained point on held-out tokens; its points.jsonl row."""
    held = heldout_loss(folder, spec.heldout_tokens)
    if held["step"] != point.steps:
        raise CheckpointError(f"point {point.name}: the newest checkpoint in {folder} is at step {held['step']}, "
                              f"not {point.steps}; rerun the sweep to finish it")
    tokens = held["tokens_seen"]  # counted by the trainer
    return {"name": point.name, "params": point.params, "non_embedding_params": point.non_embedding_params,
            "tokens": tokens, "flops": point.flops_per_token * tokens, "loss": held["loss"],
            **({"budget": point.budget} if point.budget is not None else {}),
            "steps": point.steps, "flops_per_token": point.flops_per_token, "heldout_tokens": held["tokens"],
            "train_loss": _last_train_loss(folder), "run_dir": str(folder)}


def _last_train_loss(folder: Path) -> float | None:
    losses = [r["loss"] for r in read_metrics(folder) if isinstance(r.get("loss"), (int, float))]
    return losses[-1] if losses else None


def write_points(spec: SweepSpec, sweep_dir: Path) -> list[dict]:
    """Rewrite DIR/points.jsonl from the finished points' result.json files, in sweep order."""
    rows = []
    for point in spec.points:
        result = point_dir(sweep_dir, point) / RESULT_FILE
        if result.is_file():
            rows.append(json.loads(result.read_text()))
    atomic_write_text(Path(sweep_dir) / POINTS_FILE, "".join(json.dumps(r) + "\n" for r in rows))
    return rows


def run_sweep(spec: SweepSpec, sweep_dir: str | Path, *, nproc: int = 0, only: list[str] | None = None,
              say: Callable[[str], None] = print) -> dict:
    """Train and evaluate every unfinished point (or only the named ones); returns what was done."""
    sweep_dir = Path(sweep_dir)
    names = [p.name for p in spec.points]
    for name in only or []:
        if name not in names:
            raise ConfigError(f"--points: no point named {name!r} in {spec.path}; points: {', '.join(names)}")
    if nproc < 0:
        raise ConfigError("--nproc must be >= 0")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    done = {"finished": [], "trained": [], "resumed": []}
    for i, point in enumerate(spec.points, 1):
        if only and point.name not in only:
            continue
        folder = point_dir(sweep_dir, point)
        status = point_status(sweep_dir, point)
        if status == "finished":
            say(f"[{i}/{len(spec.points)}] {point.name}: finished, skipped")
            done["finished"].append(point.name)
            continue
        _claim(spec, folder, point)
        say(f"[{i}/{len(spec.points)}] {point.name}: N = {point.params:,} ({point.non_embedding_params:,} "
            f"non-embedding), {point.steps} steps, D = {point.tokens:,}, C = {point.flops:.3g}"
            + (" (resuming)" if status == "started" else ""))
        if nproc > 1:
            _train_ranks(spec, point, folder, nproc)
        else:
            _train_here(spec, point, folder)
        row = result_row(spec, point, folder)
        atomic_write_text(folder / RESULT_FILE, json.dumps(row, indent=1))
        say(f"    held-out loss {row['loss']:.4f} on {row['heldout_tokens']:,} tokens")
        done["resumed" if status == "started" else "trained"].append(point.name)
        write_points(spec, sweep_dir)
    rows = write_points(spec, sweep_dir)
    return {**done, "points": len(rows), "points_file": str(sweep_dir / POINTS_FILE)}
