"""``meshlm plan``: predict, search and explain the parallel layout of a model on a cluster (docs/planner.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from meshlm.cli.jsonout import emit
from meshlm.errors import ConfigError

FIX_KEYS = {"dp_replicate": int, "dp_shard": int, "tp": int, "pp": int, "pp_schedule": str, "microbatches": int,
            "micro_batch_size": int, "sharding": str, "activation_checkpointing": str, "ac": str}


def register(sub, add_config_args) -> None:
    p = sub.add_parser("plan", help="predict memory, step time, communication and bubble of parallel layouts; "
                                    "recommend one and explain why")
    p.add_argument("--model", required=True, help="a flavour (debug, small, llama3-8b, ...), a gpt-* preset, a "
                                                  "meshlm .toml job config or an HF config.json")
    p.add_argument("--gpus", type=int, required=True, help="devices in the cluster")
    p.add_argument("--gpu", default="h100-80gb", help="preset: a100-40gb a100-80gb h100-80gb h200-141gb "
                                                      "mi300x-192gb, or cpu (this machine, measured)")
    p.add_argument("--gpus-per-node", type=int, help="devices per node (default: the preset's)")
    p.add_argument("--seq", type=int, required=True, help="sequence length in tokens")
    batch = p.add_mutually_exclusive_group(required=True)
    batch.add_argument("--global-batch-tokens", type=int, help="tokens per optimizer step")
    batch.add_argument("--global-batch-seqs", type=int, help="sequences per optimizer step")
    p.add_argument("--precision", default=None, choices=("fp32", "bf16", "fp16"),
                   help="compute precision (default bf16 on GPUs, fp32 on cpu)")
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"))
    p.add_argument("--accounting", default="engine", choices=("engine", "zero"),
                   help="memory of states as meshlm allocates them, or the ZeRO paper's 2+2+12 bytes/param")
    eff = p.add_mutually_exclusive_group()
    eff.add_argument("--efficiency", type=float, help="achieved/peak matmul FLOP/s (default: the preset's)")
    eff.add_argument("--calibrate", action="store_true", help="measure the efficiency on this machine (kept in "
                                                              "$MESHLM_CACHE/planner-calibration.json: training "
                                                              "runs' own predictions use it)")
    p.add_argument("--fix", default="", metavar="K=V,...",
                   help="pin layout keys, e.g. tp=8,pp=4,dp_shard=2,pp_schedule=1f1b,microbatches=16,ac=full "
                        "(micro_batch_size=B under pp > 1: local batch / B micro-batches); never refuses: reports "
                        "that layout, feasible or not")
    hw = p.add_argument_group("hardware overrides")
    hw.add_argument("--memory-gib", type=float, help="device memory")
    hw.add_argument("--peak-tflops", type=float, help="dense bf16/fp16 peak per device, TFLOP/s")
    hw.add_argument("--peak-tflops-fp32", type=float, help="dense fp32 peak per device, TFLOP/s")
    hw.add_argument("--intra-node-gbs", type=float, help="all-reduce bus bandwidth inside a node, GB/s")
    hw.add_argument("--inter-node-gbit", type=float, help="network bandwidth per node, Gbit/s (e.g. 200)")
    hw.add_argument("--intra-latency-us", type=float)
    hw.add_argument("--inter-latency-us", type=float)
    p.add_argument("--headroom", type=float, default=0.9, help="usable fraction of device memory")
    p.add_argument("--top", type=int, default=5, help="alternatives to show")
    p.add_argument("--train-tokens", type=float, help="tokens to train on: prints the training time in days")
    p.add_argument("--budget-flops", type=float, help="a compute budget: prints the Chinchilla-optimal size")
    p.add_argument("--json", action="store_true", help="print {recommended, candidates, rejected, ...}")
    p.add_argument("--emit-config", metavar="RUN.toml", help="write the recommendation as a meshlm train config")
    p.add_argument("--chart", metavar="FILE.png", help="memory breakdown per candidate")
    p.set_defaults(handler=run)


def parse_fix(text: str) -> dict[str, Any]:
    from meshlm.planner.layout import AC_MODES, SCHEDULES, SHARDINGS

    out: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in FIX_KEYS:
            from meshlm.sections import did_you_mean

            raise ConfigError(f"--fix {item!r}: expected KEY=VALUE with KEY one of {', '.join(FIX_KEYS)}"
                              f"{did_you_mean(key, FIX_KEYS)}")
        key = "activation_checkpointing" if key == "ac" else key
        try:
            out[key] = FIX_KEYS[key](value.strip())
        except ValueError:
            raise ConfigError(f"--fix {item!r}: {key} must be an integer") from None
        if isinstance(out[key], int) and out[key] < 1:
            raise ConfigError(f"--fix {item!r}: {key} must be at least 1")
    choices = {"pp_schedule": SCHEDULES, "sharding": SHARDINGS, "activation_checkpointing": AC_MODES}
    for key, allowed in choices.items():
        if key in out and out[key] not in allowed:
            raise ConfigError(f"--fix {key}={out[key]}: must be one of {', '.join(allowed)}")
    return out


def build_inputs(args: argparse.Namespace):
    from meshlm.planner.hardware import resolve_hardware
    from meshlm.planner.layout import Training
    from meshlm.planner.model_spec import resolve_model

    if args.gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {args.gpus}")
    if args.seq < 1:
        raise ConfigError(f"--seq must be positive, got {args.seq}")
    spec = resolve_model(args.model)
    tflops = {k: (v * 1e12 if v is not None else None) for k, v in
              (("peak_bf16", args.peak_tflops), ("peak_fp32", args.peak_tflops_fp32))}
    hw = resolve_hardware(args.gpu, args.gpus, memory_gib=args.memory_gib, gpus_per_node=args.gpus_per_node,
                          intra_node_gbs=args.intra_node_gbs,
                          inter_node_gbs=args.inter_node_gbit / 8 if args.inter_node_gbit is not None else None,
                          intra_latency_us=args.intra_latency_us, inter_latency_us=args.inter_latency_us, **tflops)
    if args.global_batch_tokens is not None:
        if args.global_batch_tokens < args.seq or args.global_batch_tokens % args.seq:
            raise ConfigError(f"--global-batch-tokens ({args.global_batch_tokens}) must be a positive multiple of "
                              f"--seq ({args.seq})")
        seqs = args.global_batch_tokens // args.seq
    else:
        seqs = args.global_batch_seqs
        if seqs < 1:
            raise ConfigError(f"--global-batch-seqs must be positive, got {seqs}")
    precision = args.precision or ("fp32" if hw.name == "cpu" else "bf16")
    efficiency = args.efficiency if args.efficiency is not None else hw.efficiency
    if args.calibrate:
        from meshlm.planner.calibrate import calibrate, save_calibration

        efficiency = calibrate(spec, hw, precision, args.seq)
        save_calibration(hw.name, precision, efficiency)
    training = Training(args.seq, seqs, precision, args.optimizer, efficiency, args.accounting)
    return spec, hw, training


def run(args: argparse.Namespace) -> int:
    from meshlm.planner.explain import memory_chart, plan_json, render
    from meshlm.planner.plan import make_plan

    if args.top < 0:
        raise ConfigError(f"--top must be >= 0, got {args.top}")
    spec, hw, training = build_inputs(args)
    plan = make_plan(spec, hw, training, args.gpus, parse_fix(args.fix), args.headroom, args.top)
    extra, lines = _budget(args, plan)
    if args.emit_config:
        path = _emit(args, plan)
        extra["emitted_config"] = str(path)
        lines.append(f"wrote {path}: meshlm train {path}" + (f" --nproc {args.gpus}" if args.gpus > 1 else ""))
    if args.chart:
        extra["chart"] = str(memory_chart(plan, Path(args.chart)))
        lines.append(f"wrote {extra['chart']}")
    if args.json:
        emit(plan_json(plan, extra))
    else:
        from rich.console import Console

        console = Console()
        render(plan, Console(width=max(console.width, 150)) if not console.is_terminal else console, lines)
    return 0


def _budget(args: argparse.Namespace, plan) -> tuple[dict[str, Any], list[str]]:
    from meshlm.planner.chinchilla import compute_optimal, rule_of_thumb, training_days

    extra: dict[str, Any] = {}
    lines: list[str] = []
    tps = plan.recommended.tokens_per_s
    if args.train_tokens is not None:
        if args.train_tokens <= 0:
            raise ConfigError(f"--train-tokens must be positive, got {args.train_tokens:g}")
        days = training_days(args.train_tokens, tps)
        extra["training_days"] = days
        lines.append(f"{args.train_tokens:.3g} tokens at {tps:,.0f} tokens/s: {days:,.1f} days")
    if args.budget_flops is not None:
        opt = compute_optimal(args.budget_flops)
        thumb = rule_of_thumb(args.budget_flops)
        mfu = plan.recommended.to_json(plan.training, plan.hw).get("mfu", 0.0)
        flops_per_s = plan.gpus * plan.hw.peak(plan.training.precision) * mfu
        days = args.budget_flops / flops_per_s / 86400 if flops_per_s else float("inf")
        extra["chinchilla"] = {**opt, "rule_of_thumb": thumb, "days_on_this_cluster": days}
        lines.append(f"Chinchilla ({opt['fit']}): a {args.budget_flops:.3g} FLOP budget is best spent on "
                     f"{opt['params'] / 1e9:.3g}B params x {opt['tokens'] / 1e9:,.0f}B tokens "
                     f"({opt['tokens_per_param']:.0f} tokens/param, loss {opt['loss']:.3f}); 20 tokens/param "
                     f"gives {thumb['params'] / 1e9:.3g}B x {thumb['tokens'] / 1e9:,.0f}B; {days:,.1f} days on "
                     f"this cluster at the recommendation's MFU")
    return extra, lines


def _emit(args: argparse.Namespace, plan) -> Path:
    from meshlm.planner.emit import write_config

    base = None
    if args.model.endswith(".toml"):
        from meshlm.config.loader import read_toml

        base = read_toml(args.model)
    rec = plan.recommended
    header = (f"written by: meshlm plan --model {args.model} --gpus {args.gpus} --gpu {args.gpu} --seq {args.seq}\n"
              f"layout: {rec.layout.describe()}; predicted {rec.memory.total / 2**30:.2f} GiB per device"
              + (f", {rec.tokens_per_s:,.0f} tokens/s" if rec.time else ""))
    device = "cpu" if plan.hw.name == "cpu" else "auto"
    return write_config(Path(args.emit_config), plan.spec, rec.layout, plan.training, device, base, header)
