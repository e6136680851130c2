"""The full `meshlm align` pipeline on the embedded default, timed: every stage's wall time, the load average
before and after (a figure taken on a shared machine must say so), and the held-out figures of base, SFT and
SFT+DPO with their Wilson intervals.

    python scripts/bench_align.py --run-dir runs/bench-align [--set sft.steps=300 ...] [--resume] [--threads 1]

The pipeline's budget is 20 minutes on 2 CPU cores; compare ``total_s`` with that only when the load average
stayed near the core count or below (see docs/safety.md for the quiet-machine estimate from step counts).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="align config (default: the embedded configs/align.toml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--run-dir", default=f"runs/bench-align-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--resume", action="store_true", help="reuse the finished stages of --run-dir")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads (0: torch's default); on a shared 2-core machine 1 is faster")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from meshlm.safety.align_config import load_align_config
    from meshlm.safety.metrics import DEGENERACY, HEADLINE
    from meshlm.safety.pipeline import run_pipeline

    cfg = load_align_config(args.config, args.overrides)
    load_before = os.getloadavg()
    start = time.perf_counter()
    report = run_pipeline(cfg, Path(args.run_dir), resume=args.resume)
    wall = time.perf_counter() - start
    import torch

    print(f"\nbench_align: {wall:.0f} s wall on {os.cpu_count()} CPUs, {torch.get_num_threads()} torch thread(s); "
          f"load average before "
          f"{', '.join(f'{x:.2f}' for x in load_before)}, after {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("stage seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in report["timings"].items()))
    print(f"steps: {report['steps']}, data: {report['data']['counts']}, prompt sets: {report['sets']}")
    for set_name in ("heldout", "synthetic"):
        print(f"\n{set_name}: " + " | ".join(report["models"]))
        for metric in HEADLINE + DEGENERACY:
            cells = []
            for model in report["models"].values():
                stat = model.get(set_name, {}).get(metric)
                cells.append("–" if not stat or not stat["n"] else
                             f"{stat['rate']:.3f} [{stat['ci95'][0]:.2f},{stat['ci95'][1]:.2f}] n={stat['n']}")
            print(f"  {metric:<20} " + " | ".join(cells))
    families = report["models"][report["final_model"]]["heldout"]["by_family"]
    print("\nattack success by family (final model): " + ", ".join(
        f"{name} {s['attack_success_rate']['rate']:.2f} (n={s['attack_success_rate']['n']})"
        for name, s in families.items() if s.get("attack_success_rate", {}).get("n")))
    print(f"gates: {'passed' if report['passed'] else 'FAILED'}; "
          + json.dumps([(g["gate"], g["passed"]) for g in report["gates"]]))
    print(f"report: {Path(args.run_dir) / 'report.md'}")


if __name__ == "__main__":
    main()
