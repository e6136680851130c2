"""``meshlm diagnose parity|memory|oom|slow``: the troubleshooting list as commands (docs/troubleshooting.md).

parity: "my multi-GPU results differ from single-GPU" (per-step loss and grad norm, and the causes by name);
memory: predicted vs measured bytes per rank; oom: does a config fit, and the remedies in order; slow: where a
run's step time goes, measured, beside the planner's prediction.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from meshlm.cli.jsonout import emit


def register(sub, add_config_args) -> None:
    p = sub.add_parser("diagnose", help="diagnostics")
    dsub = p.add_subparsers(dest="diagnose_command", required=True, metavar="{parity,memory,oom,slow}")
    par = dsub.add_parser("parity", help="run a layout and a single-device reference on the same seed and data; "
                                         "compare per-step loss and grad norm")
    add_config_args(par)
    par.add_argument("--nproc", type=int, required=True, help="ranks for the layout under test")
    par.add_argument("--steps", type=int, default=6)
    par.add_argument("--work-dir", help="keep both runs here (default: a temporary folder)")
    par.add_argument("--loss-rtol", type=float, default=None,
                     help="relative loss tolerance (default 1e-4, for fp32; use ~1e-2 under bf16/fp16)")
    par.add_argument("--grad-norm-rtol", type=float, default=None, help="relative grad-norm tolerance (1e-3)")
    par.add_argument("--json", action="store_true")
    par.set_defaults(handler=run_parity)
    mem = dsub.add_parser("memory", help="predicted vs measured memory per device (params, grads, optimizer, "
                                         "activations, buffers) and collective bytes per step")
    add_config_args(mem)
    mem.add_argument("--nproc", type=int, default=1, help="ranks of the layout (default 1: this process)")
    mem.add_argument("--work-dir", help="keep the measured run here (default: a temporary folder)")
    mem.add_argument("--json", action="store_true", help="print {predicted, measured, ranks}")
    mem.set_defaults(handler=run_memory)  # docs/planner.md

    oom = dsub.add_parser("oom", help="predicted memory per device; when it does not fit, the remedies in order "
                                      "(micro-batch, activation checkpointing, sharding, TP/PP) and a config that fits")
    add_config_args(oom)
    oom.add_argument("--nproc", type=int, default=1, help="devices the config runs on (default 1)")
    oom.add_argument("--gpu", help="device preset: a100-40gb a100-80gb h100-80gb h200-141gb mi300x-192gb, or cpu "
                                   "(default: cpu without CUDA)")
    oom.add_argument("--memory-gib", type=float, help="device memory, overriding the preset's")
    oom.add_argument("--headroom", type=float, default=0.9, help="usable fraction of device memory")
    oom.add_argument("--emit-config", metavar="FIT.toml", help="write the first config that fits here")
    oom.add_argument("--json", action="store_true")
    oom.set_defaults(handler=run_oom)

    slow = dsub.add_parser("slow", help="communication, data-loader wait, bubble, optimizer and straggler ranks "
                                        "of a run, measured, beside the planner's prediction; what to change")
    slow.add_argument("run_dir", help="a `meshlm train` run directory")
    slow.add_argument("--profile", type=int, metavar="STEPS",
                      help="resume a copy of the run and profile STEPS steps (torch.profiler)")
    slow.add_argument("--work-dir", help="keep the profiled copy and its chrome traces here")
    slow.add_argument("--json", action="store_true")
    slow.set_defaults(handler=run_slow)


def run_parity(args: argparse.Namespace) -> int:
    from meshlm.config.loader import config_to_toml, load_config
    from meshlm.distributed.launch import launch_local
    from meshlm.distributed.parallel_dims import ParallelDims
    from meshlm.distributed.parity import COMPARE_OVERRIDES, SINGLE_DEVICE, compare, read_records
    from meshlm.doctor.callbacks import run_callbacks
    from meshlm.doctor.parity_checks import FAIL, run_checks
    from meshlm.errors import ConfigError
    from meshlm.train.run_dir import init_run_dir
    from meshlm.train.trainer import Trainer

    if args.steps < 1 or args.nproc < 1:
        raise ConfigError("--steps and --nproc must be at least 1")
    # diagnostics.parity_probe: every rank, and the reference, records what it started from and read
    common = [*args.overrides, f"training.steps={args.steps}", *COMPARE_OVERRIDES, "diagnostics.parity_probe=true"]
    layout_cfg = load_config(args.config, common)
    dims = ParallelDims.from_config(layout_cfg.parallel, args.nproc)
    ref_cfg = load_config(args.config, [*common, *SINGLE_DEVICE])
    with tempfile.TemporaryDirectory(prefix="meshlm-parity-") as tmp:
        work = Path(args.work_dir or tmp)
        ref_dir, layout_dir = work / "reference", work / "layout"
        init_run_dir(layout_dir, config_to_toml(layout_cfg), resume=False)
        worker = ["train", *([args.config] if args.config else []), *[a for o in common for a in ("--set", o)],
                  "--run-dir", str(layout_dir), "--resume", "auto"]
        launch_local(args.nproc, 0, worker, layout_cfg.parallel.timeout_s)
        init_run_dir(ref_dir, config_to_toml(ref_cfg), resume=False)
        Trainer(ref_cfg, ref_dir, callbacks=run_callbacks(ref_cfg)).train()
        report = compare(dims.describe(), read_records(ref_dir), read_records(layout_dir))
        checks = run_checks(ref_dir, layout_dir)
        report.loss_rtol = args.loss_rtol if args.loss_rtol is not None else report.loss_rtol
        report.grad_norm_rtol = args.grad_norm_rtol if args.grad_norm_rtol is not None else report.grad_norm_rtol
    failed = [c["name"] for c in checks if c["status"] == FAIL]
    if args.json:
        emit({**report.to_json(), "ok": report.ok and not failed, "checks": checks})
    else:
        print(f"parity of {report.layout} ({args.nproc} ranks) against a single device, {args.steps} steps")
        print(f"{'step':>5} {'ref loss':>10} {'loss':>10} {'rel diff':>9} {'ref gnorm':>10} {'gnorm':>10} "
              f"{'rel diff':>9}")
        for r in report.rows:
            print(f"{r['step']:>5} {r['ref_loss']:>10.6f} {r['loss']:>10.6f} {r['loss_rel_diff']:>9.1e} "
                  f"{r['ref_grad_norm']:>10.6f} {r['grad_norm']:>10.6f} {r['grad_norm_rel_diff']:>9.1e}")
        verdict = "within" if report.ok else "BEYOND"
        print(f"{verdict} tolerance (loss rtol {report.loss_rtol:g}, grad-norm rtol {report.grad_norm_rtol:g}); "
              "see docs/parallelism.md")
        print("causes checked (docs/troubleshooting.md):")
        for c in checks:
            print(f"  {c['status'].upper():4} {c['name']}: {c['detail']}")
    return 0 if report.ok and not failed else 1


def run_memory(args: argparse.Namespace) -> int:
    from meshlm.doctor.memory import ROWS, compare, measure_config
    from meshlm.errors import ConfigError

    if args.nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {args.nproc}")
    with tempfile.TemporaryDirectory(prefix="meshlm-memory-") as tmp:
        work = Path(args.work_dir or tmp)
        records = measure_config(args.config, args.overrides, args.nproc, work)
        if not records:
            raise ConfigError(f"no memory measurement came back from the run in {work}")
        report = compare(args.config, args.overrides, args.nproc, records)
    if args.json:
        emit(report)
        return 0
    print(f"memory of {report['layout']} ({args.nproc} rank(s)): predicted vs measured, MiB per rank")
    print(f"{'rank':>4} {'':12}" + "".join(f"{k:>14}" for k in (*ROWS, "comm bytes")))
    for r in report["ranks"]:
        for label, key in (("predicted", "predicted_bytes"), ("measured", "measured_bytes")):
            vals = r[key]
            cells = "".join(f"{vals.get(k, 0) / 2**20:>14.3f}" for k in ROWS)
            print(f"{r['rank']:>4} {label:12}{cells}{vals.get('comm_bytes_per_step', 0):>14,}")
    print("params/grads/optimizer are counted from local tensors; activations = forward-created storages alive "
          "when backward starts; measured buffers = peak live bytes minus the rest (docs/planner.md)")
    return 0


def run_oom(args: argparse.Namespace) -> int:
    from meshlm.doctor.oom import diagnose

    report = diagnose(args.config, args.overrides, args.nproc, args.gpu, args.memory_gib, args.headroom,
                      args.emit_config)
    if args.json:
        emit(report)
        return 0
    from meshlm.doctor.report import print_oom

    print_oom(report)
    return 0


def run_slow(args: argparse.Namespace) -> int:
    from meshlm.doctor.slow import diagnose

    with tempfile.TemporaryDirectory(prefix="meshlm-slow-") as tmp:
        report = diagnose(args.run_dir, args.profile, Path(args.work_dir or tmp))
        if not args.work_dir:
            report["profiled_run"], report["traces"] = None, []  # gone with the temporary folder
    if args.json:
        emit(report)
        return 0
    from meshlm.doctor.report import print_slow

    print_slow(report)
    return 0
