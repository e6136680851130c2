"""The planner's step-time prediction against a measured training step on this CPU, full fine-tune and LoRA.

    python scripts/bench_planner_cpu.py --checkpoint /tmp/runs/smol --batch 4 --seq 512 --lora-rank 8

1. Calibrate as `meshlm plan --gpu cpu --calibrate` does (meshlm/planner/calibrate.py): a few one-thread steps
   of the model (4 x 256), the efficiency solved from the planner's own step-time model.
2. Measure meshlm's training step of the checkpoint with `bench_train` (the same code as `meshlm bench train`):
   the full fine-tune and LoRA (all seven projections) alternately, median of --steps, at torch's thread count.
3. Predict both steps with the planner: one device, the matmul peak measured at the run's thread count (as a
   training run's own prediction does, planner/runlog.py), the calibrated efficiency; LoRA as the planner models
   it (frozen weights skip their weight-gradient matmuls; only the adapters are updated).

Prints a markdown table, or with --json one JSON document instead. Take it on a quiet machine (the load is printed).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from meshlm.checkpoint.load import source_config
from meshlm.planner.calibrate import calibrate
from meshlm.planner.hardware import Hardware, cpu_hardware, machine_memory_gib
from meshlm.planner.layout import Layout, Training
from meshlm.planner.model_spec import from_model_config
from meshlm.planner.timing import step_time
from meshlm.train.bench import ALL_LORA_TARGETS, bench_train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--efficiency", type=float, help="skip the calibration and use this efficiency")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    load = os.getloadavg()[0]
    _, cfg = source_config(args.checkpoint)
    spec = from_model_config(cfg.model)
    efficiency = args.efficiency or calibrate(spec, cpu_hardware(1), "fp32", args.seq)
    measured = bench_train("", args.batch, args.seq, args.steps, checkpoint=args.checkpoint,
                           lora_rank=args.lora_rank, lora_targets=ALL_LORA_TARGETS, compare_full=True)
    peak = measured["matmul_peak_flops"]
    hw = Hardware("cpu", machine_memory_gib(), {"fp32": peak, "bf16": peak, "fp16": peak}, 1, 2.0, 2.0, 50.0, 50.0,
                  hbm_gbs=10.0, measured=True)
    rows = {}
    for name, lora in (("full", {}), ("lora", {"lora_rank": args.lora_rank, "lora_targets": ALL_LORA_TARGETS})):
        training = Training(args.seq, args.batch, "fp32", "adamw", efficiency, **lora)
        predicted = step_time(spec, Layout(), training, hw).step_time_s
        got = measured["full_step_time_s"] if name == "full" else measured["step_time_s"]
        rows[name] = {"predicted_s": predicted, "measured_s": got, "error": predicted / got - 1}
    result = {"checkpoint": args.checkpoint, "batch": args.batch, "seq": args.seq, "threads": torch.get_num_threads(),
              "efficiency": efficiency, "matmul_peak_flops": peak, "load_at_start": load, "steps": rows,
              "lora_to_full": {"predicted": rows["lora"]["predicted_s"] / rows["full"]["predicted_s"],
                               "measured": rows["lora"]["measured_s"] / rows["full"]["measured_s"]}}
    if args.json:  # stdout is the JSON document alone
        print(json.dumps(result))
        return
    print(f"# planner vs measured step, {args.checkpoint}, {args.batch} x {args.seq}, fp32, "
          f"{result['threads']} threads, peak {peak / 1e9:.1f} GFLOP/s, calibrated efficiency {efficiency:.3f}, "
          f"load {load:.2f} at the start\n")
    print("| step | predicted s | measured s | error |\n|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['predicted_s']:.2f} | {row['measured_s']:.2f} | {row['error']:+.1%} |")
    print(f"| LoRA / full | {result['lora_to_full']['predicted']:.2f} | {result['lora_to_full']['measured']:.2f} | |")


if __name__ == "__main__":
    main()
