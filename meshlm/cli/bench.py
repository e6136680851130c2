"""``meshlm bench train``: tokens/s, achieved FLOP/s, the matmul peak and MFU for a flavour."""

from __future__ import annotations

import argparse

from meshlm.cli.jsonout import emit


def register(sub, add_config_args) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench_command", required=True, metavar="{train}")
    t = bsub.add_parser("train", help="time training steps on synthetic tokens")
    t.add_argument("--flavor", default="debug")
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--seq", type=int, default=128)
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--warmup", type=int, default=2)
    t.add_argument("--compile", action="store_true", help="torch.compile each block")
    t.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    t.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    t.add_argument("--compare-hf", action="store_true",
                   help="also run transformers' LlamaForCausalLM with the same dimensions and report the ratio")
    t.add_argument("--json", action="store_true")
    t.set_defaults(handler=run)


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run(args: argparse.Namespace) -> int:
    from meshlm.errors import ConfigError
    from meshlm.train.bench import bench_train

    if min(args.batch, args.seq, args.steps) < 1 or args.warmup < 0:
        raise ConfigError("--batch, --seq and --steps must be at least 1, --warmup at least 0")
    r = bench_train(args.flavor, args.batch, args.seq, args.steps, warmup=args.warmup, compile=args.compile,
                    precision=args.precision, device=args.device or _default_device(), compare_hf=args.compare_hf)
    if args.json:
        emit(r)
        return 0
    print(f"{r['flavor']} ({r['params'] / 1e6:.2f}M params) batch {r['batch']} x seq {r['seq']}, {r['precision']}, "
          f"{'compiled' if r['compile'] else 'eager'}, {r['device']} ({r['num_threads']} threads)")
    print(f"  {r['tokens_per_s']:,.0f} tokens/s, {r['achieved_flops'] / 1e9:.2f} GFLOP/s achieved, "
          f"peak {r['matmul_peak_flops'] / 1e9:.2f} GFLOP/s ({r['peak_source']}), MFU {100 * r['mfu']:.1f}%")
    if "ratio_to_hf" in r:
        print(f"  transformers LlamaForCausalLM: {r['hf_tokens_per_s']:,.0f} tokens/s; meshlm/HF = "
              f"{r['ratio_to_hf']:.2f}")
    return 0
