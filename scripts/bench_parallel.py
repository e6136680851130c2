"""Per-layout CPU benchmark: step time relative to a single device, communication bytes per step and
communication share, each run through `meshlm train --nproc N` (gloo) exactly as users run it.

    python scripts/bench_parallel.py [--flavor debug] [--steps 12] [--seq 128] [--batch 16]

Prints a markdown table. On a 2-core machine, layouts with more than 2 ranks oversubscribe the cores (each rank
runs one compute thread), so their step times measure the layout's overhead plus contention, not scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LAYOUTS = [
    ("single device", 1, {}),
    ("DDP 2", 2, {"dp_replicate": 2, "dp_shard": 1}),
    ("FSDP 2", 2, {"dp_shard": 2}),
    ("FSDP 2, reshard never (ZeRO-2-like)", 2, {"dp_shard": 2, "reshard_after_forward": '"never"'}),
    ("FSDP 4", 4, {"dp_shard": 4}),
    ("HSDP 2x2", 4, {"dp_replicate": 2, "dp_shard": 2}),
    ("TP 2 + SP", 2, {"tp": 2, "dp_shard": 1}),
    ("TP 2, no SP", 2, {"tp": 2, "dp_shard": 1, "sequence_parallel": "false"}),
    ("PP 2 GPipe", 2, {"pp": 2, "dp_shard": 1, "pp_schedule": '"gpipe"'}),
    ("PP 2 1F1B", 2, {"pp": 2, "dp_shard": 1, "pp_schedule": '"1f1b"'}),
    ("PP 2 interleaved 1F1B", 2, {"pp": 2, "dp_shard": 1, "pp_schedule": '"interleaved-1f1b"'}),
    ("FSDP 2 x TP 2", 4, {"dp_shard": 2, "tp": 2}),
    ("PP 2 x FSDP 2", 4, {"pp": 2, "dp_shard": 2}),
    ("PP 2 x TP 2", 4, {"pp": 2, "tp": 2, "dp_shard": 1}),
    ("PP 2 x FSDP 2 x TP 2", 8, {"pp": 2, "dp_shard": 2, "tp": 2}),
]


def run_layout(nproc: int, parallel: dict, args, work: Path) -> dict:
    run_dir = work / f"run-{len(list(work.iterdir()))}"
    overrides = {"training.steps": args.steps, "metrics.interval": 1, "checkpoint.enabled": "false",
                 "training.eval_interval": 0, "metrics.tensorboard": "false", "metrics.progress": '"plain"',
                 "data.seq_len": args.seq, "training.batch_size": args.batch, "model.flavor": f'"{args.flavor}"',
                 **{f"parallel.{k}": v for k, v in parallel.items()}}
    cmd = [sys.executable, "-m", "meshlm", "train", "--run-dir", str(run_dir),
           *[a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = [r["step_time_s"] for r in records if r["step"] > 3]  # skip warm-up and the instrumented step
    last = records[-1]
    return {"step_time_s": statistics.median(steady), "comm_bytes": last.get("comm_bytes_per_step", 0),
            "comm_share": last.get("comm_share", 0.0), "comm": last.get("comm", {})}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavor", default="debug")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    print(f"# layouts on CPU/gloo: `{args.flavor}`, global batch {args.batch} x {args.seq}, median step time over "
          f"steps 4-{args.steps}, {os.cpu_count()} cores\n")
    print("| layout | ranks | step time (s) | vs single device | comm bytes/step (payload) | comm share |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        base = None
        for name, nproc, parallel in LAYOUTS:
            r = run_layout(nproc, parallel, args, Path(tmp))
            base = base or r["step_time_s"]
            kinds = ", ".join(f"{k} {v['bytes'] / 1e6:.2f} MB/{v['calls']}" for k, v in sorted(r["comm"].items()))
            print(f"| {name} | {nproc} | {r['step_time_s']:.3f} | {r['step_time_s'] / base:.2f}x | "
                  f"{r['comm_bytes'] / 1e6:.2f} MB ({kinds or 'none'}) | {100 * r['comm_share']:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
