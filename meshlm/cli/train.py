"""``meshlm train``: train a model from a job config."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from meshlm.config.loader import config_to_toml, load_config
from meshlm.train.run_dir import init_run_dir


def register(sub, add_config_args) -> None:
    p = sub.add_parser("train", help="train a model (pretraining on the embedded corpus by default)")
    add_config_args(p)
    p.add_argument("--run-dir", help="where metrics, checkpoints and plots go (default runs/<flavor>-<time>)")
    p.add_argument("--resume", choices=["auto"], help="continue from the newest valid checkpoint in --run-dir")
    p.add_argument("--stop-at", type=int, metavar="STEP",
                   help="stop (after checkpointing) at this step, as a time-sliced job would; resume later")
    p.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    p.set_defaults(handler=run)


def default_run_dir(flavor: str) -> Path:
    return Path("runs") / f"{flavor}-{time.strftime('%Y%m%d-%H%M%S')}"


def run(args: argparse.Namespace) -> int:
    import json

    from meshlm.errors import ConfigError
    from meshlm.plots import plot_loss
    from meshlm.train.trainer import Trainer

    cfg = load_config(args.config, args.overrides)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(cfg.model.flavor)
    if args.resume and not args.run_dir:
        raise ConfigError("--resume auto needs --run-dir pointing at the run to continue")
    init_run_dir(run_dir, config_to_toml(cfg), resume=bool(args.resume))
    trainer = Trainer(cfg, run_dir, resume=bool(args.resume), stop_at=args.stop_at)
    summary = trainer.train()
    plot = plot_loss(run_dir)
    summary.update(run_dir=str(run_dir), loss_plot=str(plot))
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"run directory: {run_dir}  (metrics.jsonl, checkpoints/, {plot.relative_to(run_dir)})")
    return 0
