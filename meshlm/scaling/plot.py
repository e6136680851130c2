"""The fit as a PNG: IsoFLOP curves with their fitted minima, and loss against compute with the frontier."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from meshlm.plots import _save
from meshlm.scaling.isoflop import group_rows
from meshlm.scaling.report import FitResult


def plot_fit(result: FitResult, out: Path, budget: float | None = None) -> Path:
    """Left: loss vs N per IsoFLOP group (points, the parabola, its minimum; approach 3's prediction dashed), or
    per token budget when the rows are a grid. Right: loss vs C for every run, approach 3's compute-optimal
    frontier L*(C), the measured lower envelope, held-out runs and the budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, a3 = result.rows, result.approach3
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=110)
    iso = result.document["isoflop"]
    groups = group_rows(rows) if iso else [np.flatnonzero(rows.tokens == t) for t in np.unique(rows.tokens)]
    for i, idx in enumerate(groups):
        idx = idx[np.argsort(rows.params[idx])]
        color = f"C{i % 10}"
        label = (f"C = {np.median(rows.flops[idx]):.2g}" if iso else f"D = {rows.tokens[idx[0]]:.2g}")
        left.plot(rows.params[idx], rows.loss[idx], "o", color=color, label=label)
        n = np.geomspace(rows.params[idx].min() / 1.5, rows.params[idx].max() * 1.5, 100)
        if iso:
            k = np.median(rows.flops[idx] / (rows.params[idx] * rows.tokens[idx]))
            c = np.median(rows.flops[idx])
            left.plot(n, a3.law.loss(n, c / (k * n)), "--", color=color, alpha=0.6)
            if len(np.unique(rows.params[idx])) >= 3:
                coef = np.polyfit(np.log(rows.params[idx]), rows.loss[idx], 2)
                left.plot(n, np.polyval(coef, np.log(n)), "-", color=color, alpha=0.8)
        else:
            left.plot(n, a3.law.loss(n, rows.tokens[idx[0]]), "--", color=color, alpha=0.6)
    if iso:
        used = [g for g in iso["groups"] if g["used"]]
        left.plot([g["params_opt"] for g in used], [g["loss_min"] for g in used], "k*", markersize=12,
                  label="parabola minima (approach 2)")
    left.set(xscale="log", xlabel="parameters N", ylabel="held-out loss",
             title="IsoFLOP profiles (solid: parabola, dashed: approach 3)" if iso else
             "loss vs size per token budget (dashed: approach 3)")
    _compute_panel(right, result, budget)
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _save(fig, out)
    return out


def _compute_panel(ax, result: FitResult, budget: float | None) -> None:
    rows, a3, fitted = result.rows, result.approach3, result.fitted
    sc = ax.scatter(rows.flops[fitted], rows.loss[fitted], c=np.log10(rows.params[fitted]), cmap="viridis", s=25,
                    label="fitted runs")
    ax.figure.colorbar(sc, ax=ax, label="log10 N")
    order = np.argsort(rows.flops)
    envelope = np.minimum.accumulate(rows.loss[order])
    ax.step(rows.flops[order], envelope, where="post", color="gray", alpha=0.7, label="measured lower envelope")
    hi = max(rows.flops.max(), budget or 0) * 2
    c = np.geomspace(rows.flops.min() / 2, hi, 100)
    frontier = [a3.law.optimal(v, a3.k)["loss"] for v in c]
    ax.plot(c, frontier, "k-", label="compute-optimal L*(C), approach 3")
    if (~fitted).any():
        h = ~fitted
        ax.plot(rows.flops[h], rows.loss[h], "rx", markersize=10, label="held out (measured)")
        ax.plot(rows.flops[h], a3.law.loss(rows.params[h], rows.tokens[h]), "r+", markersize=10,
                label="held out (predicted)")
    if budget:
        ax.axvline(budget, color="C3", linestyle=":", label=f"budget {budget:.2g}")
    ax.set(xscale="log", xlabel="training FLOPs C", ylabel="held-out loss", title="loss vs compute")
