"""``meshlm align [CONFIG] --run-dir DIR`` (the whole safety-alignment pipeline) and its subcommands
``meshlm align data`` (synthesise the dataset from a spec) and ``meshlm align constitutional``.

argparse cannot put an optional CONFIG positional in front of subcommands (the subcommand positional would take
the config path as a command name), so the align parser has one positional that takes everything after it:
when its first word names a subcommand, that subcommand's parser reads the rest; otherwise the words are the
pipeline form (CONFIG and its options).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from meshlm.cli.align_constitutional import add_parser as add_constitutional
from meshlm.cli.jsonout import emit

COMMANDS_HELP = "data,constitutional"


def _add_pipeline_args(p: argparse.ArgumentParser, with_config: bool) -> None:
    if with_config:
        p.add_argument("config", nargs="?", help="an align config (default: configs/align.toml, embedded)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one align-config key (repeatable), e.g. --set sft.steps=100")
    p.add_argument("--run-dir", help="where data, checkpoints, evaluations and the report go "
                                     "(default runs/align-<time>)")
    p.add_argument("--resume", choices=["auto"], help="continue a stopped run: complete stages are reused")
    p.add_argument("--no-cache", dest="cache", action="store_false", default=None,
                   help="neither read nor write the cache of generations and judge labels ($MESHLM_CACHE/align), "
                        "which otherwise serves a model's answers to the same inputs from any earlier run")
    p.add_argument("--json", action="store_true", help="print the report (without per-prompt records) as JSON")


class _ConfigOrCommand(argparse.Action):
    """The align positional: ``data ...`` / ``constitutional ...`` go to that subcommand, anything else is the
    pipeline's ``CONFIG [options]``."""

    def __init__(self, option_strings, dest, commands: dict[str, argparse.ArgumentParser],
                 pipeline: argparse.ArgumentParser, **kwargs) -> None:
        self.commands, self.pipeline = commands, pipeline
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        name, rest = values[0], values[1:]
        if name in self.commands:
            sub = self.commands[name].parse_args(rest)  # its own defaults (handler) win over the pipeline's
            for key, value in vars(sub).items():
                setattr(namespace, key, value)
            namespace.align_command = name
        else:  # options already read before CONFIG stay in the namespace; those after it are parsed here
            self.pipeline.parse_args(values, namespace)


def register(sub, add_config_args) -> None:
    p = sub.add_parser("align", help="safety alignment: spec -> data -> SFT -> DPO -> red team -> evaluation -> "
                                     "gates (and `align data`, `align constitutional`)",
                       description="meshlm align [CONFIG] --run-dir DIR runs the whole pipeline; meshlm align data "
                                   "--out DIR writes the dataset only; meshlm align constitutional writes "
                                   "critique/revision data. See docs/safety.md.")
    _add_pipeline_args(p, with_config=False)
    holder = argparse.ArgumentParser(prog="meshlm align", add_help=False)
    cmds = holder.add_subparsers(dest="align_command")
    data = cmds.add_parser("data", help="synthesise SFT, preference, evaluation and labelled data from a spec")
    data.add_argument("--spec", help="behaviour spec TOML (default: the embedded one)")
    data.add_argument("--out", required=True, help="output folder")
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--heldout", help="a held-out prompts JSONL that training must not near-duplicate, checked "
                                        "in addition to every shipped held-out file (safety/data/heldout_prompts*)")
    data.add_argument("--json", action="store_true", help="print the manifest as JSON")
    data.set_defaults(handler=run_data)
    add_constitutional(cmds)
    pipeline = argparse.ArgumentParser(prog="meshlm align", add_help=False)
    _add_pipeline_args(pipeline, with_config=True)
    action = p.add_argument("target", nargs=argparse.PARSER, action=_ConfigOrCommand, commands=cmds.choices,
                            pipeline=pipeline, metavar=f"CONFIG | {{{COMMANDS_HELP}}}",
                            help="an align config for the pipeline, or a subcommand and its options")
    action.required = False  # no positional at all: the pipeline on the embedded config
    p.set_defaults(handler=run_align, config=None, align_command=None)


def run_data(args: argparse.Namespace) -> int:
    from meshlm.safety.pipeline import make_dataset

    manifest = make_dataset(args.spec or "", Path(args.out), args.seed, heldout=args.heldout or "")
    if args.json:
        emit(manifest)
    else:
        counts = ", ".join(f"{k} {v}" for k, v in manifest["counts"].items())
        print(f"wrote {args.out}: {counts} (spec {manifest['spec_version']}, seed {args.seed})")
    return 0


def run_align(args: argparse.Namespace) -> int:
    from meshlm.safety.align_config import load_align_config
    from meshlm.safety.pipeline import run_pipeline

    cfg = load_align_config(args.config, args.overrides)
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / f"align-{time.strftime('%Y%m%d-%H%M%S')}"
    report = run_pipeline(cfg, run_dir, resume=bool(args.resume), cache=args.cache is not False)
    if args.json:
        emit(report)
    else:
        print(f"report: {run_dir / 'report.md'}  gates {'passed' if report['passed'] else 'FAILED'}")
    return 0 if report["passed"] else 1
