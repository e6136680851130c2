"""``meshlm scaling fit INPUT``: fit scaling laws to finished runs (docs/scaling.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from meshlm.cli.jsonout import emit


def register(sub, add_config_args) -> None:
    p = sub.add_parser("scaling", help="scaling laws: fit L(N, D) to a sweep, compute-optimal allocation")
    ssub = p.add_subparsers(dest="scaling_command", required=True, metavar="{fit}")
    fit = ssub.add_parser("fit", help="Chinchilla approach 3 (and approach 2 on IsoFLOP groups) with bootstrap "
                                      "intervals; --budget gives the compute-optimal N, D and loss")
    fit.add_argument("input", help="a sweep directory (its points.jsonl) or a JSONL file of rows with params, "
                                   "tokens, loss (flops optional)")
    fit.add_argument("--budget", type=float, metavar="FLOPS", help="compute budget C for the optimal allocation")
    fit.add_argument("--holdout", action="append", default=[], metavar="NAME",
                     help="leave this row out of the fit and report its predicted vs measured loss (repeatable)")
    fit.add_argument("--params-key", default="params", choices=("params", "non_embedding_params"),
                     help="which column is N (default: every parameter, as Hoffmann et al.)")
    fit.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for the 95%% intervals")
    fit.add_argument("--starts", type=int, default=0,
                     help="L-BFGS from the best K grid points (0: all 4,500, as the papers do)")
    fit.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    fit.add_argument("--plot", metavar="FILE.png",
                     help="where the plot goes (default: DIR/scaling_fit.png, or INPUT.fit.png beside a file)")
    fit.add_argument("--json", action="store_true", help="print {fit, ci95, optimal, isoflop, residuals, ...}")
    fit.set_defaults(handler=run_fit)


def default_plot_path(input_path: str) -> Path:
    path = Path(input_path)
    return path / "scaling_fit.png" if path.is_dir() else path.with_suffix(".fit.png")


def run_fit(args: argparse.Namespace) -> int:
    from meshlm.scaling.plot import plot_fit
    from meshlm.scaling.report import fit_scaling, json_safe, render_text
    from meshlm.scaling.rows import read_rows

    rows = read_rows(args.input, params_key=args.params_key)
    result = fit_scaling(rows, budget=args.budget, holdout=args.holdout, bootstrap=args.bootstrap,
                         starts=args.starts, seed=args.seed)
    plot = plot_fit(result, Path(args.plot) if args.plot else default_plot_path(args.input), args.budget)
    doc = {**result.document, "params_key": args.params_key, "plot": str(plot)}
    if args.json:
        emit(json_safe(doc))  # NaN/inf (a degenerate fit) become null
    else:
        print(render_text(doc))
        print(f"plot: {plot}")
    return 0
