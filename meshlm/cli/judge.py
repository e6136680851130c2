"""``meshlm judge``: label responses refuse | warn | answer | unclear, and train the judge and guard classifiers.

    meshlm judge INPUT.jsonl --out OUT.jsonl [--judge rule|encoder[:DIR]|trained:DIR|llm:URL#MODEL] [--json]
    meshlm judge --train-judge LABELLED.jsonl --out DIR [--steps N] [--trunk RUN] [--json]
    meshlm judge --train-judge shipped --train-judge synthetic:500 [--train-judge LABELLED.jsonl ...]
                 --encoder minilm|DIR --out DIR [--epochs N] [--seed S] [--adapter-rank R] [--lr LR] [--json]
    meshlm judge --train-guard LABELLED.jsonl --out DIR [--spec SPEC.toml] [--steps N] [--trunk RUN] [--json]

INPUT rows are ``{"prompt", "response", ...}``; OUT has each row plus ``"label"``. LABELLED rows are
``{"prompt", "response", "label", "category"}`` (``meshlm align data`` writes labelled_responses.jsonl).
With ``--encoder`` the judge is a pretrained BERT-family encoder fine-tuned on the rows (the encoder judge,
meshlm/safety/encoder_judge.py); ``shipped`` names the hand-written labelled sets shipped with meshlm, less the
sealed test sets. The judges, their flags and their trainers are the plug-ins of meshlm/safety/judges/; a
trainer whose head has no unclear class leaves the rows labelled unclear out (degenerate text is labelled unclear
before any head).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from meshlm.cli.jsonout import emit
from meshlm.errors import ConfigError, DataError
from meshlm.safety import judges
from meshlm.safety.taxonomy import LABELS


def register(sub, add_config_args) -> None:
    p = sub.add_parser("judge", help="label responses refuse/warn/answer/unclear; train a judge or guard classifier",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", nargs="?", help="JSONL of {prompt, response} rows to label")
    p.add_argument("--out", required=True, help="OUT.jsonl for labels; a folder with --train-judge/--train-guard")
    judges.add_judge_arguments(p)
    train = p.add_mutually_exclusive_group()
    train.add_argument("--train-judge", metavar="LABELLED.jsonl", action="append",
                       help="train a classifier judge on labelled rows; repeat to add sources: a file, 'shipped' "
                            "(the hand-written sets shipped with meshlm, less the sealed test sets) or "
                            "'synthetic:N' (N rows of the embedded spec's synthesis)")
    train.add_argument("--train-guard", metavar="LABELLED.jsonl", help="train a guard on labelled rows (--steps, "
                                                                        "--trunk as the trained judge)")
    p.add_argument("--spec", help="behaviour spec for --train-guard (category policies); the embedded one by default")
    judges.add_train_arguments(p)
    p.add_argument("--json", action="store_true", help="print a summary as JSON")
    p.set_defaults(handler=run)


def read_jsonl(path: str | Path, required: tuple[str, ...]) -> list[dict]:
    from meshlm.data.jsonl import iter_jsonl

    rows = []
    for where, row in iter_jsonl(path, f"a JSONL file of {{{', '.join(required)}}} rows"):
        for key in required:
            if not isinstance(row.get(key), str):
                raise DataError(f"{where}: {key!r} must be a string")
        rows.append(row)
    if not rows:
        raise DataError(f"{path} has no rows")
    return rows


def _train_flags_given(args: argparse.Namespace) -> list[str]:
    return [f.name for cls in judges.kinds().values() for f in cls.train_flags
            if getattr(args, f.dest, None) is not None]


def run(args: argparse.Namespace) -> int:
    if args.train_judge or args.train_guard:
        if args.input:
            raise ConfigError("give either INPUT (to label) or --train-judge/--train-guard, not both")
        return _train_judge(args) if args.train_judge else _train_guard(args)
    given = _train_flags_given(args)
    if given:
        raise ConfigError(f"{', '.join(given)} train a judge: use them with --train-judge LABELLED.jsonl|shipped")
    if not args.input:
        raise ConfigError("missing INPUT.jsonl: the {prompt, response} rows to label")
    return _label(args)


def _label(args: argparse.Namespace) -> int:
    from meshlm.fileio import atomic_write_text

    rows = read_jsonl(args.input, ("response",))
    for number, row in enumerate(rows, 1):
        if not isinstance(row.get("prompt", ""), str):
            raise DataError(f"{args.input}: row {number}: 'prompt' must be a string")
    judge = judges.make_judge(args.judge, judges.judge_options(args))
    labels = judge.label([r.get("prompt", "") for r in rows], [r["response"] for r in rows])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "".join(json.dumps({**r, "label": lab}, ensure_ascii=False) + "\n"
                                   for r, lab in zip(rows, labels)))
    counts = Counter(labels)
    summary = {"judge": judge.name, "n": len(rows), "out": str(out),
               "labels": {k: counts.get(k, 0) for k in LABELS}}
    if "label" in rows[0] and all(r.get("label") in summary["labels"] for r in rows):
        correct = sum(r["label"] == lab for r, lab in zip(rows, labels))
        summary["accuracy_vs_input_labels"] = correct / len(rows)
    if args.json:
        emit(summary)
    else:
        counts_text = ", ".join(f"{k} {v}" for k, v in summary["labels"].items())
        print(f"judge {judge.name}: {len(rows)} rows -> {out} ({counts_text})")
    return 0


def _labelled_rows(sources: list[str]) -> list[dict]:
    """The training rows of every source (a trainer whose head has no unclear class leaves those rows out)."""
    from meshlm.safety.encoder_judge import shipped_training_rows, synthetic_rows

    rows = []
    for source in sources:
        if source == "shipped":
            rows += shipped_training_rows()
            continue
        if source.startswith("synthetic:"):
            count = source.partition(":")[2]
            if not (count.isascii() and count.isdigit()):
                raise ConfigError(f"--train-judge {source}: expected synthetic:N with N a whole number of rows")
            rows += synthetic_rows(int(count))
            continue
        part = read_jsonl(source, ("prompt", "response", "label"))
        bad = [i for i, r in enumerate(part, 1) if r["label"] not in LABELS]
        if bad:
            raise DataError(f"{source}: row {bad[0]}: 'label' must be one of {', '.join(LABELS)}, "
                            f"got {part[bad[0] - 1]['label']!r}")
        rows += part
    return rows


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _train_judge(args: argparse.Namespace) -> int:
    kind = judges.trainer_for(args)
    options = {**judges.train_options(kind, args), "sources": list(args.train_judge)}  # pinned by hash in judge.json
    rows = _labelled_rows(args.train_judge)
    return _report_saved(args, kind.train(rows, options, args.out, _log))


def _train_guard(args: argparse.Namespace) -> int:
    from meshlm.safety.classifier import ClassifierConfig
    from meshlm.safety.guard import Guard
    from meshlm.safety.spec import load_spec

    trained = judges.kinds()["trained"]
    foreign = [f for f in _train_flags_given(args) if f not in {flag.name for flag in trained.train_flags}]
    if foreign:
        raise ConfigError(f"{', '.join(foreign)} do not train a guard; a guard takes --steps, --trunk and --spec")
    steps = 300 if args.steps is None else args.steps
    if steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {steps}")
    rows = read_jsonl(args.train_guard, ("prompt", "response", "label"))
    _log(f"training a guard on {len(rows)} rows ({steps} steps)")
    spec = load_spec(args.spec)
    model = Guard.train(rows, {name: c.policy for name, c in spec.categories.items()}, ClassifierConfig(steps=steps),
                        trunk=args.trunk)
    return _report_saved(args, {"kind": "guard", "out": str(model.save(args.out)), **model.meta["training"]})


def _report_saved(args: argparse.Namespace, summary: dict) -> int:
    if args.json:
        emit(summary)
    else:
        print(f"saved {summary['kind']} to {summary['out']}: train accuracy {summary['train_accuracy']:.3f}, "
              f"{summary['seconds']} s")
    return 0
