"""``meshlm inspect``: what a checkpoint holds, and whether it is intact."""

from __future__ import annotations

import argparse

from meshlm.cli.jsonout import emit


def register(sub, add_config_args) -> None:
    p = sub.add_parser("inspect", help="show a checkpoint's step, config, parameter count and weights hash")
    p.add_argument("checkpoint", help="a run directory (newest valid checkpoint) or a step folder")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from meshlm.checkpoint.load import model_from_checkpoint, weights_sha256
    from meshlm.config.base import to_dict

    model, cfg, state, ckpt = model_from_checkpoint(args.checkpoint)
    info = {
        "checkpoint": str(ckpt),
        "step": state["step"],
        "tokens_seen": state.get("tokens_seen"),
        "num_params": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        "weights_sha256": weights_sha256(model),
        "config": {name: to_dict(getattr(cfg, name)) for name in cfg.__dataclass_fields__},
    }
    if args.json:
        emit(info, indent=1)
    else:
        print(f"checkpoint     {info['checkpoint']} (verified)")
        print(f"step           {info['step']}  ({info['tokens_seen']:,} tokens seen)")
        print(f"model          {cfg.model.flavor}: {info['num_params']:,} parameters")
        print(f"weights_sha256 {info['weights_sha256']}")
    return 0
