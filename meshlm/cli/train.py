"""``meshlm train``: train a model from a job config, on one device or ``--nproc N`` local ranks."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from meshlm.cli.jsonout import emit
from meshlm.config.loader import config_to_toml, load_config
from meshlm.errors import ConfigError
from meshlm.fileio import atomic_write_text

SUMMARY = "summary.json"  # with --json --nproc N: rank 0's end-of-run summary, for the launching process


def register(sub, add_config_args) -> None:
    p = sub.add_parser("train", help="train a model (pretraining on the embedded corpus by default)")
    add_config_args(p)
    p.add_argument("--run-dir", help="where metrics, checkpoints and plots go (default runs/<flavor>-<time>)")
    p.add_argument("--resume", choices=["auto"], help="continue from the newest valid checkpoint in --run-dir")
    p.add_argument("--stop-at", type=int, metavar="STEP",
                   help="stop (after checkpointing) at this step, as a time-sliced job would; resume later")
    p.add_argument("--nproc", type=int, default=0, metavar="N",
                   help="launch N local ranks through torchrun's elastic agent (gloo on CPU, NCCL on GPUs)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="K",
                   help="with --nproc: restart the ranks up to K times after a failure, resuming from the newest "
                        "valid checkpoint")
    p.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    p.set_defaults(handler=run)


def default_run_dir(flavor: str) -> Path:
    return Path("runs") / f"{flavor}-{time.strftime('%Y%m%d-%H%M%S')}"


def run(args: argparse.Namespace) -> int:
    # A missing or unreadable config is answered before torch is imported (worker_env reads the environment only).
    from meshlm.distributed.worker_env import in_worker

    from meshlm.train.tracking import check_trackers

    cfg = load_config(args.config, args.overrides, inherit=True)  # init_from's [model] keys fill the gaps
    check_trackers(cfg.metrics)  # a tracker's missing package, before minutes of set-up
    if args.resume and not args.run_dir:
        raise ConfigError("--resume auto needs --run-dir pointing at the run to continue")
    if args.nproc < 0 or args.max_restarts < 0:
        raise ConfigError("--nproc and --max-restarts must be >= 0")
    if args.nproc > 1 and not in_worker():
        return _launch(args, cfg)
    return _train(args, cfg)


def _launch(args: argparse.Namespace, cfg) -> int:
    """Parent process: validate, claim the run directory, then start the ranks."""
    from meshlm.distributed.launch import launch_local
    from meshlm.distributed.parallel_dims import ParallelDims
    from meshlm.train.run_dir import init_run_dir

    ParallelDims.from_config(cfg.parallel, args.nproc)  # a layout that cannot fit fails here, before any spawn
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(cfg.model.flavor)
    init_run_dir(run_dir, config_to_toml(cfg), resume=bool(args.resume))
    worker = ["train", *([args.config] if args.config else []), *[a for o in args.overrides for a in ("--set", o)],
              "--run-dir", str(run_dir), "--resume", "auto"]
    if args.stop_at:
        worker += ["--stop-at", str(args.stop_at)]
    if args.json:
        worker.append("--json")
    launch_local(args.nproc, args.max_restarts, worker, cfg.parallel.timeout_s)  # rank 0 reports the run
    if args.json:  # the ranks' stdout is this process's stderr: rank 0 left the summary in the run directory
        emit(json.loads((run_dir / SUMMARY).read_text()))
    return 0


def _train(args: argparse.Namespace, cfg) -> int:
    """One rank (or the single device): train in this process."""
    import torch.distributed as dist

    from meshlm.distributed.launch import init_distributed
    from meshlm.distributed.worker_env import in_worker
    from meshlm.plots import plot_loss
    from meshlm.doctor.callbacks import run_callbacks
    from meshlm.train.run_dir import check_run_dir, write_run_dir
    from meshlm.train.trainer import Trainer

    init_distributed(cfg.parallel.timeout_s, cfg.training.device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if in_worker() and not args.run_dir:
        raise ConfigError("under torchrun every rank needs the same --run-dir")
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(cfg.model.flavor)
    toml = config_to_toml(cfg)
    check_run_dir(run_dir, toml, resume=bool(args.resume))  # every rank checks before any rank writes
    if dist.is_initialized():
        dist.barrier()
    if rank == 0:
        write_run_dir(run_dir, toml)
    try:
        trainer = Trainer(cfg, run_dir, resume=bool(args.resume), stop_at=args.stop_at,
                          callbacks=run_callbacks(cfg))  # the planner's log, [diagnostics]
        summary = trainer.train()
    except BaseException:
        if dist.is_initialized():  # no barrier: the peers may never reach it
            dist.destroy_process_group()
        raise
    if dist.is_initialized():
        # Leave together: a rank that tears down its gloo pairs while a peer still finishes the last
        # collective can make that peer abort.
        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return 0
    plot = plot_loss(run_dir)
    summary.update(run_dir=str(run_dir), loss_plot=str(plot))
    if args.json and in_worker():
        atomic_write_text(run_dir / SUMMARY, json.dumps(summary))  # the launching process prints it
    elif args.json:
        emit(summary)
    else:
        print(f"run directory: {run_dir}  (metrics.jsonl, checkpoints/, {plot.relative_to(run_dir)})")
    return 0

