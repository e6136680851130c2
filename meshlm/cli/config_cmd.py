"""``meshlm config show|keys``: the resolved config and every key with its type, default and meaning."""

from __future__ import annotations

import argparse

from meshlm.cli.jsonout import emit


def register(sub, add_config_args) -> None:
    p = sub.add_parser("config", help="show the resolved config or list every key")
    csub = p.add_subparsers(dest="config_command", required=True, metavar="{show,keys}")
    show = csub.add_parser("show", help="print the resolved config (file + --set + defaults) as TOML")
    add_config_args(show)
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=run_show)
    keys = csub.add_parser("keys", help="list every config key with type, default and documentation")
    keys.add_argument("--json", action="store_true")
    keys.set_defaults(handler=run_keys)


def run_show(args: argparse.Namespace) -> int:
    from meshlm.sections import to_dict
    from meshlm.config.loader import config_to_toml, load_config

    cfg = load_config(args.config, args.overrides)
    if args.json:
        emit({name: to_dict(getattr(cfg, name)) for name in cfg.__dataclass_fields__}, indent=1)
    else:
        print(config_to_toml(cfg), end="")
    return 0


def run_keys(args: argparse.Namespace) -> int:
    from meshlm.sections import describe
    from meshlm.config.schema import SECTIONS

    rows = [row for name, cls in SECTIONS.items() for row in describe(cls, name)]
    if args.json:
        emit([{"key": k, "type": t, "default": d, "doc": doc} for k, t, d, doc in rows], indent=1)
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("key", "type", "default", "meaning", show_lines=False)
    for key, tp, default, doc in rows:
        table.add_row(key, tp, repr(default), doc)
    Console(width=160).print(table)
    return 0
