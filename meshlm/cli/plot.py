"""``meshlm plot RUN_DIR... [--out FILE.png]``: loss, learning rate, throughput and memory curves."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub, add_config_args) -> None:
    p = sub.add_parser("plot", help="plot loss, learning rate, throughput and memory of one or more runs")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (each with metrics.jsonl)")
    p.add_argument("--out", help="the PNG to write (default RUN_DIR/plots/curves.png for one run, "
                   "./meshlm-plot.png for several)")
    p.add_argument("--metrics", help="comma-separated metrics.jsonl keys to plot instead, one panel each (e.g. "
                   "reward,kl or rewards/margins,rewards/accuracies; eval_ values are drawn beside them)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from meshlm.errors import ConfigError
    from meshlm.plots import plot_curves

    runs = [Path(d) for d in args.run_dirs]
    if args.out:
        out = Path(args.out)
    else:
        out = runs[0] / "plots" / "curves.png" if len(runs) == 1 else Path("meshlm-plot.png")
    if out.suffix.lower() != ".png":
        raise ConfigError(f"--out {out}: the plot is a PNG; give a file name ending in .png")
    metrics = [k.strip() for k in args.metrics.split(",") if k.strip()] if args.metrics else None
    print(f"wrote {plot_curves(runs, out, metrics)}")
    return 0
