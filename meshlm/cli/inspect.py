"""``meshlm inspect``: what a checkpoint holds, and whether it is intact."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from meshlm.cli.jsonout import emit


def register(sub, add_config_args) -> None:
    p = sub.add_parser("inspect", help="show a checkpoint's step, config, parameter count, chat template and "
                                       "weights hash")
    p.add_argument("checkpoint", help="a run directory (newest valid checkpoint) or a step folder")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def chat_template_info(ckpt: Path) -> dict[str, Any]:
    """Which chat template generation and fine-tuning use for this checkpoint: a Jinja template it carries
    (chat_template.jinja or the tokenizer_config.json key), meshlm's own, or none (a foreign tokenizer without one)."""
    from meshlm.data.posttrain.templates import read_hf_chat_template
    from meshlm.tokenizer import SPECIAL_TOKENS, MeshTokenizer

    found = read_hf_chat_template(ckpt)
    if found is not None:  # the .jinja file wins over the key, as in transformers
        where = "chat_template.jinja" if (ckpt / "chat_template.jinja").is_file() else "tokenizer_config.json"
        return {"kind": "jinja", "file": where, "chars": len(found[0])}
    tokenizer = MeshTokenizer.load(ckpt / "tokenizer.json")
    meshlm = all(s in tokenizer.special_ids for s in SPECIAL_TOKENS)
    return {"kind": "meshlm" if meshlm else "none", "file": None, "chars": 0}


def run(args: argparse.Namespace) -> int:
    from meshlm.checkpoint.load import model_from_checkpoint, weights_sha256
    from meshlm.sections import to_dict

    model, cfg, state, ckpt = model_from_checkpoint(args.checkpoint)
    info = {
        "checkpoint": str(ckpt),
        "step": state["step"],
        "tokens_seen": state.get("tokens_seen"),
        # model.parameters() yields a shared (tied) parameter once, so a tied head is counted once
        "num_params": sum(p.numel() for p in model.parameters()),
        "weights_sha256": weights_sha256(model),
        "source": cfg.model.source or None,
        "chat_template": chat_template_info(ckpt),
        "config": {name: to_dict(getattr(cfg, name)) for name in cfg.__dataclass_fields__},
    }
    if args.json:
        emit(info, indent=1)
    else:
        chat = info["chat_template"]
        print(f"checkpoint     {info['checkpoint']} (verified)")
        print(f"step           {info['step']}  ({info['tokens_seen']:,} tokens seen)")
        source = f" from {cfg.model.source}" if cfg.model.source else ""
        tied = ", tied head" if cfg.model.tie_embeddings else ""
        print(f"model          {cfg.model.flavor}{source}: {info['num_params']:,} parameters{tied}")
        print("chat template  " + {"jinja": f"{chat['file']} ({chat['chars']:,} characters)",
                                   "meshlm": "meshlm's (<|system|>/<|user|>/<|assistant|> ... <|end|>)",
                                   "none": "none (the tokenizer has no chat template; --chat cannot be used)"}[
                                       chat["kind"]])
        print(f"weights_sha256 {info['weights_sha256']}")
    return 0
