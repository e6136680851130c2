"""Peak memory per rank of a large model under FSDP: what each rank holds beyond a tiny run, per parameter.

    python scripts/bench_scale_memory.py [--nproc 8] [--steps 2] [--json]

Runs `meshlm train --nproc N` (gloo, FSDP over every rank, fp32, AdamW) twice with diagnostics.peak_rss=true, which
makes every rank write its process-lifetime peak RSS (initialisation included) into the run directory:
once for the `debug` flavour and once for a ~250M-parameter model made from --set overrides, both with the same
tiny batch. The per-rank increase of the large run over the debug run, divided by the large model's parameter
count, is the memory per parameter each rank pays for the model. The steady FSDP state with fp32 AdamW is 16
bytes per parameter (weights, gradients, two moments) over N ranks — 2 B/param at N = 8 — plus the gathered
blocks in flight. A rank that materialises the whole fp32 model at some point pays at least 4 B/param more.

Allocator: by default the ranks run with MALLOC_MMAP_THRESHOLD_=131072, so glibc serves every buffer over 128 KiB
with its own mapping and returns it to the OS when torch frees it. With glibc's default (a threshold that grows
to 32 MiB after the first large free; --mmap-threshold 0) freed per-parameter buffers (gradients, gathered
blocks, optimizer temporaries) stay in the heap, and peak RSS measures the allocator's retention more than the
tensors alive at any moment (docs/benchmarks.md shows both).
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

# ~240M parameters (20 layers of dim 1024, GQA 16/8 heads, SwiGLU 2816; the embedded corpus' 2048-token
# vocabulary, untied): large enough that a whole fp32 copy (~0.96 GB) dwarfs the interpreter and torch.
LARGE = {"model.dim": 1024, "model.n_layers": 20, "model.n_heads": 16, "model.n_kv_heads": 8,
         "model.ffn_hidden_dim": 2816, "model.vocab_size": 2048}


def num_params(model_overrides: dict) -> int:
    from meshlm.config.loader import load_config

    cfg = load_config(None, [f"{k}={v}" for k, v in model_overrides.items()])
    return cfg.model.num_params()


def run(model_overrides: dict, args, work: Path, name: str) -> list[int]:
    run_dir = work / name
    overrides = {"training.steps": args.steps, "training.batch_size": args.nproc, "data.seq_len": args.seq,
                 "parallel.dp_shard": args.nproc, "training.precision": '"fp32"', "checkpoint.enabled": "false",
                 "training.eval_interval": 0, "metrics.tensorboard": "false", "metrics.progress": '"plain"',
                 "diagnostics.peak_rss": "true", **model_overrides}
    cmd = [sys.executable, "-m", "meshlm", "train", "--nproc", str(args.nproc), "--run-dir", str(run_dir),
           *[a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if args.mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    files = sorted((run_dir / "peak_rss").glob("rank-*.json"))
    if len(files) != args.nproc:
        sys.exit(f"expected {args.nproc} peak_rss files in {run_dir}, found {len(files)}: does this meshlm "
                 "honour diagnostics.peak_rss?")
    return [json.loads(f.read_text())["peak_rss_bytes"] for f in files]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--mmap-threshold", type=int, default=131072,
                   help="MALLOC_MMAP_THRESHOLD_ for the ranks in bytes; 0 keeps glibc's dynamic default")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    large_params = num_params(LARGE)
    with tempfile.TemporaryDirectory() as tmp:
        debug = run({"model.flavor": '"debug"'}, args, Path(tmp), "debug")
        large = run(LARGE, args, Path(tmp), "large")
    per_param = [(big - small) / large_params for big, small in zip(large, debug)]
    report = {"nproc": args.nproc, "mmap_threshold": args.mmap_threshold, "large_params": large_params, "debug_peak_rss_bytes": debug,
              "large_peak_rss_bytes": large, "bytes_per_param": per_param,
              "bytes_per_param_max": max(per_param), "bytes_per_param_median": statistics.median(per_param),
              "steady_fsdp_bytes_per_param": 16 / args.nproc}
    if args.json:
        print(json.dumps(report))
        return
    threshold = args.mmap_threshold or "glibc default"
    print(f"FSDP x{args.nproc}, fp32 AdamW, {large_params / 1e6:.1f}M params vs debug, MALLOC_MMAP_THRESHOLD_ "
          f"{threshold}; peak RSS per rank:")
    print("| rank | debug (MiB) | large (MiB) | increase (B/param) |")
    print("|---:|---:|---:|---:|")
    for rank, (small, big, b) in enumerate(zip(debug, large, per_param)):
        print(f"| {rank} | {small / 2**20:.0f} | {big / 2**20:.0f} | {b:.2f} |")
    print(f"max {max(per_param):.2f} B/param, median {statistics.median(per_param):.2f} B/param "
          f"(steady FSDP state: {16 / args.nproc:.2f} B/param)")


if __name__ == "__main__":
    main()
