"""Training throughput benchmark: meshlm flavours eager vs compiled, with transformers' LlamaForCausalLM of the
same dimensions in the same process as the reference. Prints a markdown table (and JSON lines with --json).

    python scripts/bench_train.py                                   # CPU: debug and small, fp32
    python scripts/bench_train.py --device cuda --precision bf16    # a GPU
    python scripts/bench_train.py --flavors small --profile         # where meshlm's step spends its time
    python scripts/bench_train.py --flavors small --threads 1 --cpu-time --no-compile   # on a loaded machine

Each process alternates meshlm and HF steps (one each, in turn) and reports tokens/s from the median step
time, so that load from other processes on a shared machine falls on both alike; the ratio is the robust
figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import torch

from meshlm.train.bench import bench_train, profile_train_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavors", default="debug,small")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--no-compile", action="store_true", help="skip the compiled runs")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers reference")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own choice)")
    p.add_argument("--cpu-time", action="store_true", help="time steps by the thread's CPU time (with --threads 1): "
                                                            "robust on a machine other processes load")
    p.add_argument("--logits-loss", action="store_true", help="meshlm takes the loss from logits (the TP/PP path) "
                                                                "instead of its fused head")
    p.add_argument("--json", action="store_true")
    p.add_argument("--profile", action="store_true", help="print the profiler's top ops of meshlm's eager step "
                                                           "(each flavour) instead of benchmarking")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.profile:
        for flavor in args.flavors.split(","):
            print(f"# {flavor}: top ops of meshlm's training step, batch {args.batch} x seq {args.seq}, "
                  f"{args.precision}, {torch.get_num_threads()} threads")
            print(profile_train_step(flavor, args.batch, args.seq, precision=args.precision, device=args.device))
        return
    device = args.device
    name = torch.cuda.get_device_name() if device == "cuda" else f"{platform.processor() or platform.machine()}, " \
        f"{torch.get_num_threads()} threads"
    print(f"# bench train on {device} ({name}), torch {torch.__version__}, {args.precision}, batch {args.batch} x "
          f"seq {args.seq}, {args.steps} timed steps after {args.warmup} warm-up; {_load()} at the start\n")
    print("| flavour | mode | tokens/s | achieved GFLOP/s | peak GFLOP/s | MFU | HF tokens/s | meshlm / HF |")
    print("|---|---|---|---|---|---|---|---|")
    for flavor in args.flavors.split(","):
        for compile_ in ([False] if args.no_compile else [False, True]):
            r = bench_train(flavor, args.batch, args.seq, args.steps, warmup=args.warmup, compile=compile_,
                            precision=args.precision, device=device, compare_hf=not args.no_hf,
                            cpu_time=args.cpu_time, fused_head=not args.logits_loss)
            hf = f"{r['hf_tokens_per_s']:,.0f} | {r['ratio_to_hf']:.2f}" if "ratio_to_hf" in r else "n/a | n/a"
            print(f"| {flavor} | {'compiled' if compile_ else 'eager'} | {r['tokens_per_s']:,.0f} | "
                  f"{r['achieved_flops'] / 1e9:,.1f} | {r['matmul_peak_flops'] / 1e9:,.1f} | {100 * r['mfu']:.1f}% | "
                  f"{hf} |", flush=True)
            if args.json:
                print(json.dumps(r))
    print(f"\n# {_load()} at the end (other processes on the machine inflate absolute figures; read the ratio)")


def _load() -> str:
    """The 1/5/15-minute load averages: a figure taken on a busy machine must say so."""
    return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


if __name__ == "__main__":
    main()
