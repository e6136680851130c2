"""``meshlm bench train``: tokens/s, achieved FLOP/s, the matmul peak and MFU for a flavour.
``meshlm bench generate``: decoding tokens/s, time to first token and ms per step of a checkpoint."""

from __future__ import annotations

import argparse

from meshlm.cli.jsonout import emit
from meshlm.models.family import LINEARS

LORA_TARGETS = tuple(lin.target for lin in LINEARS)  # the torch-free family module: the parser must not import torch


def register(sub, add_config_args) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench_command", required=True, metavar="{train,generate}")
    t = bsub.add_parser("train", help="time training steps on synthetic tokens")
    t.add_argument("--flavor", default="debug")
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--seq", type=int, default=128)
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--warmup", type=int, default=2)
    t.add_argument("--compile", action="store_true", help="torch.compile each block")
    t.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    t.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    t.add_argument("--checkpoint", help="a run directory or step folder (e.g. a converted model) instead of "
                                        "--flavor's random weights")
    t.add_argument("--lora-rank", type=int, default=0, help="LoRA of this rank, base frozen (0: full fine-tune)")
    t.add_argument("--lora-targets", default=",".join(LORA_TARGETS),
                   help=f"comma-separated projections to adapt (default: all seven, {','.join(LORA_TARGETS)})")
    t.add_argument("--lora-alpha", type=float, default=16.0)
    t.add_argument("--compare-full", action="store_true", help="with --lora-rank: also time the full fine-tune step")
    t.add_argument("--compare-hf", action="store_true",
                   help="also run transformers' model on the same weights (PEFT's LoRA with --lora-rank) and report "
                        "the ratio")
    t.add_argument("--json", action="store_true")
    t.set_defaults(handler=run)
    _register_generate(bsub)


def _register_generate(bsub) -> None:
    g = bsub.add_parser("generate", help="time greedy decoding of a checkpoint (exactly N new tokens a row)")
    g.add_argument("--checkpoint", required=True, help="a run directory (newest valid checkpoint) or a step folder")
    g.add_argument("--batch", type=int, default=1, help="rows decoded together")
    g.add_argument("--prompt-len", type=int, default=32, help="tokens per prompt (random ids, seeded)")
    g.add_argument("--new-tokens", type=int, default=64, help="tokens generated per row (eos ignored)")
    g.add_argument("--repeats", type=int, default=3, help="timed runs (the median is reported)")
    g.add_argument("--warmup", type=int, default=1)
    g.add_argument("--plain", action="store_true", help="the model's plain forward instead of the fast decode path")
    g.add_argument("--weights", default="fp32", choices=("fp32", "int8", "int4"),
                   help="int8: decode steps on int8 copies of the weights (CPU; faster, not the same logits; "
                        "docs/model.md, 'int8 decode weights'); int4: 4-bit copies (CPU, "
                        "faster still, further from fp32; 'Speed levers')")
    g.add_argument("--speculative", choices=("ngram",), default=None,
                   help="ngram: prompt-lookup drafts verified in one forward (batch 1, fp32; the same greedy tokens)")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    g.add_argument("--compare-hf", action="store_true",
                   help="also run transformers' generate on the same weights; report the ratio and whether the "
                        "greedy tokens are identical")
    g.add_argument("--json", action="store_true")
    g.set_defaults(handler=run_generate)


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run(args: argparse.Namespace) -> int:
    from meshlm.errors import ConfigError

    if min(args.batch, args.seq, args.steps) < 1 or args.warmup < 0 or args.lora_rank < 0:
        raise ConfigError("--batch, --seq and --steps must be at least 1, --warmup and --lora-rank at least 0")
    targets = tuple(t for t in args.lora_targets.replace(" ", "").split(",") if t)
    unknown = sorted(set(targets) - set(LORA_TARGETS))
    if unknown or not targets:
        raise ConfigError(f"--lora-targets {args.lora_targets!r}: choose from {','.join(LORA_TARGETS)}")
    if args.compare_full and not args.lora_rank:
        raise ConfigError("--compare-full compares a LoRA step with the full one: add --lora-rank R")
    from meshlm.train.bench import bench_train

    r = bench_train(args.flavor, args.batch, args.seq, args.steps, warmup=args.warmup, compile=args.compile,
                    precision=args.precision, device=args.device or _default_device(), compare_hf=args.compare_hf,
                    checkpoint=args.checkpoint, lora_rank=args.lora_rank, lora_targets=targets,
                    lora_alpha=args.lora_alpha, compare_full=args.compare_full)
    if args.json:
        emit(r)
        return 0
    print(f"{r['flavor']} ({r['params'] / 1e6:.2f}M params) batch {r['batch']} x seq {r['seq']}, {r['precision']}, "
          f"{'compiled' if r['compile'] else 'eager'}, {r['device']} ({r['num_threads']} threads)")
    print(f"  {r['tokens_per_s']:,.0f} tokens/s, {r['achieved_flops'] / 1e9:.2f} GFLOP/s achieved, "
          f"peak {r['matmul_peak_flops'] / 1e9:.2f} GFLOP/s ({r['peak_source']}), MFU {100 * r['mfu']:.1f}%")
    if r["lora_rank"]:
        print(f"  LoRA rank {r['lora_rank']} on {','.join(r['lora_targets'])}: {r['trainable_params']:,} trainable "
              f"parameters, {r['step_time_s']:.2f} s per step")
    if "full_step_time_s" in r:
        print(f"  full fine-tune: {r['full_step_time_s']:.2f} s per step; LoRA/full = {r['lora_to_full_step']:.2f}")
    if "ratio_to_hf" in r:
        peer = "transformers + PEFT" if r["hf_peft"] else "transformers"
        print(f"  {peer}: {r['hf_tokens_per_s']:,.0f} tokens/s ({r['hf_step_time_s']:.2f} s per step); meshlm/HF = "
              f"{r['ratio_to_hf']:.2f}")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    from meshlm.errors import CheckpointError, ConfigError

    if min(args.batch, args.prompt_len, args.new_tokens, args.repeats) < 1 or args.warmup < 0:
        raise ConfigError("--batch, --prompt-len, --new-tokens and --repeats must be at least 1, --warmup at least 0")
    if args.speculative and (args.batch != 1 or args.weights != "fp32"):
        raise ConfigError(f"--speculative {args.speculative} decodes one greedy fp32 sequence: use --batch 1 and "
                          "--weights fp32, or drop --speculative")
    if args.plain and args.weights != "fp32":
        raise ConfigError(f"--plain runs the model's own fp32 forward; --weights {args.weights} needs the fast path: "
                          "drop one of them")
    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.generate.bench import bench_generate

    device = args.device or _default_device()
    model, cfg, _, ckpt = model_from_checkpoint(args.checkpoint, device)
    if getattr(model.output, "out_features", None) != cfg.model.vocab_size:
        raise CheckpointError(f"{ckpt} has no vocabulary head (a reward model's score head?): it cannot generate; "
                              "pass a policy checkpoint")
    r = bench_generate(model, batch=args.batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                       repeats=args.repeats, warmup=args.warmup, compare_hf=args.compare_hf, fast=not args.plain,
                       device=device, weights=args.weights, speculative=args.speculative)
    r["checkpoint"] = str(ckpt)
    if args.json:
        emit(r)
        return 0
    print(f"{ckpt} ({r['params'] / 1e6:.1f}M params, {r['dtype']}) batch {r['batch']}, prompt {r['prompt_len']}, "
          f"{r['new_tokens']} new tokens, {'plain forward' if args.plain else 'fast path'}, {r['weights']} weights, "
          f"{r['device']} "
          f"({r['num_threads']} threads)")
    print(f"  end to end {r['tokens_per_s']:,.1f} tokens/s: first token {1e3 * r['time_to_first_token_s']:.1f} ms, "
          f"then {r['ms_per_step']:.1f} ms per decode step (bandwidth bound {r['bandwidth_bound_ms_per_step']:.1f} "
          f"ms: {r['weight_bytes'] / 1e6:.0f} MB at {r['copy_bytes_per_s'] / 1e9:.1f} GB/s)")
    if args.compare_hf:
        print(f"  transformers generate: end to end {r['hf_tokens_per_s']:,.1f} tokens/s, first token "
              f"{1e3 * r['hf_time_to_first_token_s']:.1f} ms, {r['hf_ms_per_step']:.1f} ms per step; meshlm/HF end to "
              f"end = {r['ratio_to_hf']:.2f}, first token {r['ttft_to_hf']:.2f}x HF's; greedy tokens identical: "
              f"{r['hf_identical']} ({r['hf_identical_rows']}/{r['batch']} rows)")
    if args.speculative:
        print(f"  speculative {args.speculative}: {r['speculative_accepted']}/{r['speculative_drafted']} drafted "
              f"tokens accepted, {r['speculative_forwards']} forwards for {r['new_tokens']} tokens")
    print(f"  fast-path packs: {r['pack_bytes'] / 1e6:.0f} MB beside the weights, made once in "
          f"{r['pack_build_s']:.2f} s; load average {r['load_average_start']:.1f} -> {r['load_average_end']:.1f}")
    return 0
