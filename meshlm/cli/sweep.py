"""``meshlm sweep SWEEP.toml``: train a grid or IsoFLOP set of model sizes x token budgets, resumably, and
write the held-out losses to DIR/points.jsonl for ``meshlm scaling fit`` (docs/scaling.md)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from meshlm.cli.jsonout import emit


def register(sub, add_config_args) -> None:
    p = sub.add_parser("sweep", help="scaling-law sweep: train every point of SWEEP.toml (finished points are "
                                     "skipped, interrupted ones resumed) and write DIR/points.jsonl")
    p.add_argument("sweep", help="a sweep file, e.g. configs/sweep-embedded.toml")
    p.add_argument("--run-dir", help="the sweep directory (default runs/sweep-<name>)")
    p.add_argument("--nproc", type=int, default=0, metavar="N", help="train each point on N local ranks")
    p.add_argument("--points", default="", metavar="NAME,...", help="run only these points")
    p.add_argument("--dry-run", action="store_true", help="list the points (size, steps, tokens, FLOPs, status) "
                                                          "without training")
    p.add_argument("--json", action="store_true", help="print the plan (--dry-run) or what was done as JSON")
    p.set_defaults(handler=run)


def _plan(spec, sweep_dir: Path) -> dict:
    from meshlm.scaling.sweep import point_status

    return {"sweep": str(spec.path), "base": str(spec.base), "kind": spec.kind, "run_dir": str(sweep_dir),
            "heldout_tokens": spec.heldout_tokens, "skipped": spec.skipped,
            "points": [{"name": p.name, "params": p.params, "non_embedding_params": p.non_embedding_params,
                        "steps": p.steps, "tokens": p.tokens, "flops": p.flops, "flops_per_token": p.flops_per_token,
                        "budget": p.budget, "status": point_status(sweep_dir, p)} for p in spec.points]}


def run(args: argparse.Namespace) -> int:
    from meshlm.scaling.spec import load_sweep
    from meshlm.scaling.sweep import run_sweep

    spec = load_sweep(args.sweep)
    stem = Path(args.sweep).stem
    sweep_dir = Path(args.run_dir) if args.run_dir else Path("runs") / (stem if stem.startswith("sweep") else
                                                                        f"sweep-{stem}")
    if args.dry_run:
        plan = _plan(spec, sweep_dir)
        if args.json:
            emit(plan)
            return 0
        print(f"{spec.kind} sweep of {len(spec.points)} points from {spec.base} into {sweep_dir}")
        print(f"{'name':<16} {'params':>10} {'non-emb':>10} {'steps':>6} {'tokens':>10} {'FLOPs':>9}  status")
        for p in plan["points"]:
            print(f"{p['name']:<16} {p['params']:>10,} {p['non_embedding_params']:>10,} {p['steps']:>6} "
                  f"{p['tokens']:>10,} {p['flops']:>9.3g}  {p['status']}")
        for s in spec.skipped:
            print(f"left out: {s['name']} ({s['reason']})")
        return 0
    only = [n for n in args.points.split(",") if n]
    start = time.perf_counter()
    done = run_sweep(spec, sweep_dir, nproc=args.nproc, only=only or None)
    done["seconds"] = time.perf_counter() - start
    if args.json:
        emit(done)
    else:
        print(f"{done['points']} finished point(s) in {done['points_file']} ({len(done['trained'])} trained, "
              f"{len(done['resumed'])} resumed, {len(done['finished'])} already finished; {done['seconds']:.0f} s); "
              f"fit with `meshlm scaling fit {sweep_dir}`")
    return 0
