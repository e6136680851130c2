"""Megatron's Table 1 (Narayanan et al. 2021) against the planner, with a fixed cost per matmul kernel.

    python scripts/fit_matmul_overhead.py [--grid 0:50:2]

For each t0 of the grid (µs per matmul kernel, meshlm/planner/timing.py) the a100-80gb efficiency is calibrated
on the 7.5B row and the other nine rows are predicted; then, leaving one row out at a time, t0 is chosen to
minimise the largest error over the other eight and the held-out row is predicted with it (docs/planner.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from meshlm.planner.hardware import resolve_hardware  # noqa: E402
from meshlm.planner.layout import Layout, Training  # noqa: E402
from meshlm.planner.model_spec import GPT_PRESETS  # noqa: E402
from meshlm.planner.search import evaluate  # noqa: E402
from test_planner import MEGATRON  # noqa: E402  (the table, written once)

CALIBRATION = "gpt-7.5b"


def predicted_tflops(efficiency: float, t0_us: float) -> dict[str, float]:
    hw = dataclasses.replace(resolve_hardware("a100-80gb", 8), matmul_overhead_us=t0_us)
    out = {}
    for name, tp, pp, gpus, batch, _ in MEGATRON:
        spec, dp = GPT_PRESETS[name], gpus // (tp * pp)
        layout = Layout(dp, 1, tp, pp, "1f1b", 1, microbatches=batch // dp if pp > 1 else 1, micro_batch_size=1,
                        sharding="none", activation_checkpointing="full")
        step = evaluate(spec, layout, Training(2048, batch, "fp16", efficiency=efficiency), hw).time.step_time_s
        s, l, h, v = 2048, spec.n_layers, spec.dim, spec.vocab_size
        out[name] = 96 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)) / (step * gpus) / 1e12
    return out


def errors(t0_us: float) -> tuple[float, dict[str, float]]:
    """(efficiency calibrated on the 7.5B row, relative error of every row) at this t0."""
    published = {name: pub for name, *_, pub in MEGATRON}
    lo, hi = 0.05, 1.0
    for _ in range(30):  # bisection: the step is not linear in the efficiency (memory-bound parts)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted_tflops(mid, t0_us)[CALIBRATION] < published[CALIBRATION] else (lo, mid)
    got = predicted_tflops(lo, t0_us)
    return lo, {name: got[name] / published[name] - 1 for name in published}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", default="0:50:2", help="start:stop:step of t0 in µs (stop included)")
    args = p.parse_args()
    start, stop, step = (float(x) for x in args.grid.split(":"))
    grid = [start + i * step for i in range(int((stop - start) / step) + 1)]
    table = {t0: errors(t0) for t0 in grid}
    for t0, (eff, err) in table.items():
        cells = "  ".join(f"{n[4:]} {e * 100:+.1f}%" for n, e in err.items())
        print(f"t0 {t0:5.1f} µs  efficiency {eff:.3f}  {cells}")
    rows = [name for name, *_ in MEGATRON if name != CALIBRATION]
    print("\nleave one out:")
    for held in rows:
        rest = [n for n in rows if n != held]
        t0 = min(grid, key=lambda t: max(abs(table[t][1][n]) for n in rest))
        print(f"  {held}: t0 {t0:g} µs fitted on the other {len(rest)}, error {table[t0][1][held] * 100:+.1f}%")


if __name__ == "__main__":
    main()
