"""Plots of a run's metrics (PNG, matplotlib's non-interactive backend)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from meshlm.errors import DataError

# (metrics.jsonl key, panel title, y label) for the 2x2 panels of `meshlm plot`; loss also draws eval_loss.
CURVE_PANELS = (
    ("loss", "loss", "nats/token"),
    ("lr", "learning rate", "lr"),
    ("tokens_per_s", "throughput", "tokens/s"),
    ("memory_gib", "peak memory", "GiB"),
)


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    records = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def _save(fig, out: Path) -> None:
    """Write the figure atomically (temp file + rename) and close it."""
    import matplotlib.pyplot as plt

    tmp = out.with_name(out.stem + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out)


def plot_curves(run_dirs: list[Path], out: Path, metrics: list[str] | None = None) -> Path:
    """Loss (+ held-out loss), learning rate, throughput and memory of each run, overlaid and labelled by folder
    name, as 2x2 panels in one PNG; ``metrics`` names other metrics.jsonl keys to draw instead, one panel each
    (with the ``eval_`` key beside it when logged). Raises DataError for a run without metrics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = []
    for run_dir in map(Path, run_dirs):
        records = [r for r in read_metrics(run_dir) if isinstance(r, dict) and "step" in r]
        if not records:
            what = "holds no metric records" if (run_dir / "metrics.jsonl").is_file() else "does not exist"
            raise DataError(f"{run_dir / 'metrics.jsonl'} {what}; pass run directories written by `meshlm train`")
        runs.append((run_dir.resolve(), records))
    names = [path.name for path, _ in runs]  # two runs both called "run": label them parent/run
    runs = [(path.name if names.count(path.name) == 1 else f"{path.parent.name}/{path.name}", records)
            for path, records in runs]
    panels = [(key, key, key) for key in metrics] if metrics else list(CURVE_PANELS)
    rows = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3.5 * rows), dpi=110, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (key, title, ylabel) in zip(axes.flat, panels):
        for i, (label, records) in enumerate(runs):
            color = f"C{i % 10}"
            _curve(ax, records, key, label, color, "-")
            if key == "loss" or (metrics and not key.startswith("eval_")):
                _curve(ax, records, f"eval_{key}", f"{label} (held-out)", color, "o--")
        ax.set(title=title, xlabel="step", ylabel=ylabel)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, f"no '{key}' in metrics", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    _save(fig, out)
    return out


def _curve(ax, records: list[dict], key: str, label: str, color: str, style: str) -> None:
    points = [(r["step"], r[key]) for r in records
              if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    if points:
        marker = "o" if len(points) < 30 or "o" in style else None  # a few points (or one) stay visible
        ax.plot(*zip(*points), style.replace("o", ""), marker=marker, color=color, label=label, markersize=3)


def plot_loss(run_dir: Path, baseline: float | None = None) -> Path:
    """Write ``RUN_DIR/plots/loss.png``: training loss, held-out loss and (optionally) a baseline line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    out = Path(run_dir) / "plots" / "loss.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot([r["step"] for r in records], [r["loss"] for r in records], label="train loss")
    evals = [r for r in records if "eval_loss" in r]
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="held-out loss")
    if baseline is not None:
        ax.axhline(baseline, color="gray", linestyle="--", label=f"unigram baseline ({baseline:.2f})")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(Path(run_dir).name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    _save(fig, out)
    return out


def plot_stage_losses(stages: list[tuple[str, Path]], out: Path) -> Path:
    """One panel per training stage, side by side (e.g. pretrain, SFT, DPO): each stage's training loss (and
    held-out loss when logged) against its own steps. The stages' losses are different quantities (nats/token of
    raw text, of assistant tokens, a preference loss), so each keeps its own axis. Raises DataError for a stage
    whose run directory holds no metrics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not stages:
        raise DataError("plot_stage_losses: no stages given")
    runs = []
    for label, run_dir in stages:
        records = [r for r in read_metrics(run_dir) if isinstance(r, dict) and "step" in r]
        if not records:
            raise DataError(f"{Path(run_dir) / 'metrics.jsonl'}: no metric records for stage '{label}'")
        runs.append((label, records))
    fig, axes = plt.subplots(1, len(runs), figsize=(4 * len(runs), 3.5), dpi=110, squeeze=False)
    for i, (ax, (label, records)) in enumerate(zip(axes.flat, runs)):
        _curve(ax, records, "loss", "train", f"C{i % 10}", "-")
        _curve(ax, records, "eval_loss", "held-out", f"C{i % 10}", "o--")
        ax.set(title=label, xlabel="step", ylabel="loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _save(fig, out)
    return out
