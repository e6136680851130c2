"""``meshlm <command> [CONFIG.toml] [--set section.key=value ...]``.

User mistakes (:class:`meshlm.errors.UserError`) print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from meshlm.cli.jsonout import json_stdout
from meshlm.distributed.worker_env import in_worker, rank_prefix
from meshlm.errors import UserError


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="a TOML job config (see configs/); defaults apply without one")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config key (repeatable), e.g. --set training.steps=10")


# Every module of meshlm.cli with a ``register(sub, add_config_args)`` function is a command (or a group of
# them); the rest (main, jsonout, ...) are helpers. Adding a command is adding a module.
def command_modules() -> list:
    import importlib
    import pkgutil

    import meshlm.cli

    modules = []
    for info in sorted(pkgutil.iter_modules(meshlm.cli.__path__), key=lambda i: i.name):
        if info.name in ("main", "jsonout") or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"meshlm.cli.{info.name}")
        if callable(getattr(module, "register", None)):
            modules.append(module)
    return modules


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meshlm", description="Train, align, evaluate and serve Llama-family "
                                     "models on PyTorch's distributed engine.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in command_modules():
        module.register(sub, _add_config_args)
    return parser


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = args.handler
    if in_worker():  # unexpected exceptions go to torchelastic's error file, so the launcher can report them
        from torch.distributed.elastic.multiprocessing.errors import record

        handler = record(handler)
    try:
        with json_stdout(bool(getattr(args, "json", False))):  # --json: logs to stderr, the document to stdout
            code = handler(args) or 0
    except UserError as exc:
        print(f"{rank_prefix()}meshlm {args.command}: error: {exc}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        print(f"meshlm {args.command}: interrupted", file=sys.stderr)
        code = 130
    if in_worker():
        _exit_worker(code)
    raise SystemExit(code)


def _exit_worker(code: int) -> None:
    """End a torchrun worker without interpreter finalization: its gloo threads outlive the destroyed process
    group and abort the process (SIGABRT) if one touches Python while the interpreter shuts down
    (meshlm/distributed/teardown.py says why)."""
    from meshlm.distributed.teardown import end_rank

    end_rank(code)


if __name__ == "__main__":
    main()
