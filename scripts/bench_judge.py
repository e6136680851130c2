"""Judge accuracy and confusion matrices on labelled responses ({prompt, response, label} JSONL).

    python scripts/bench_judge.py                                   # rule judge on the shipped sets
    python scripts/bench_judge.py --judge rule --judge trained:DIR --data labelled.jsonl
    python scripts/bench_judge.py --train-on labelled_responses.jsonl   # also train a judge here and bench it
    python scripts/bench_judge.py --train-on labelled.jsonl --train-features roles  # ... on the rule roles too
    python scripts/bench_judge.py --errors                          # print every misjudged row
    python scripts/bench_judge.py --judge rule --judge encoder:DIR --data a.jsonl --data b.jsonl --pooled --unseen

Prints one block per (judge, data set): accuracy with its Wilson 95% interval, per-label recall and the
confusion matrix (rows: the true label, columns: the judge's), and with --json one document with all of them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from meshlm.safety import evalsets
from meshlm.safety.judges import make_judge
from meshlm.safety.metrics import wilson
from meshlm.safety.taxonomy import LABELS

DATA = Path(__file__).resolve().parents[1] / "meshlm" / "safety" / "data"
SHIPPED = tuple(evalsets.names("judge"))  # every labelled set of meshlm/safety/evalsets.toml, dev then sealed


def read_labelled(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    bad = [i for i, r in enumerate(rows, 1) if r.get("label") not in LABELS or "response" not in r]
    if bad:
        sys.exit(f"{path}: rows {bad[:5]} lack a response or a label in {LABELS}")
    return rows


def bench(judge, rows: list[dict]) -> dict:
    start = time.perf_counter()
    predicted = judge.label([r.get("prompt", "") for r in rows], [r["response"] for r in rows])
    seconds = time.perf_counter() - start
    matrix = {t: {p: 0 for p in LABELS} for t in LABELS}
    for row, label in zip(rows, predicted):
        matrix[row["label"]][label] += 1
    correct = sum(matrix[t][t] for t in LABELS)
    lo, hi = wilson(correct, len(rows))
    recall = {t: (matrix[t][t] / sum(matrix[t].values()) if sum(matrix[t].values()) else None) for t in LABELS}
    errors = [{**row, "predicted": label} for row, label in zip(rows, predicted) if label != row["label"]]
    return {"n": len(rows), "accuracy": correct / len(rows), "ci95": [lo, hi], "recall": recall,
            "confusion": matrix, "seconds": seconds, "errors": errors}


def print_block(name: str, data: str, result: dict, show_errors: bool) -> None:
    lo, hi = result["ci95"]
    print(f"\n== judge {name} on {data}: accuracy {result['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] "
          f"(n={result['n']}, {result['seconds']:.2f} s)")
    print("true \\ judged " + "".join(f"{p:>8}" for p in LABELS) + "   recall")
    for t in LABELS:
        rec = result["recall"][t]
        print(f"{t:>13} " + "".join(f"{result['confusion'][t][p]:>8}" for p in LABELS) +
              f"   {'-' if rec is None else f'{rec:.3f}'}")
    if show_errors:
        for e in result["errors"]:
            print(f"  [{e['label']} -> {e['predicted']}] {e['response'][:160]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--judge", action="append",
                        help="rule | trained:PATH | encoder:PATH | llm:URL#MODEL (repeatable)")
    parser.add_argument("--data", action="append", type=Path, help="labelled JSONL (repeatable)")
    parser.add_argument("--train-on", type=Path, help="train a judge on this labelled JSONL and bench it too")
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--train-features", choices=("text", "roles"), default="text",
                        help="roles: prefix each response with the rule judge's clause roles")
    parser.add_argument("--errors", action="store_true")
    parser.add_argument("--pooled", action="store_true", help="also score each judge on all the sets together")
    parser.add_argument("--unseen", action="store_true",
                        help="also score the rows whose prompt (case-folded) is in none of the encoder judge's "
                             "`shipped` training rows")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    judges = [(spec, make_judge(spec)) for spec in (args.judge or ["rule"])]
    if args.train_on:
        from meshlm.safety.judges.trained import TrainedJudge

        start = time.perf_counter()
        trained = TrainedJudge.fit(read_labelled(args.train_on), steps=args.train_steps,
                                     features=args.train_features)
        print(f"trained judge on {args.train_on} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        judges.append((f"trained({args.train_on.name}, {args.train_features})", trained))
    datasets = args.data or [DATA / name for name in SHIPPED]
    report = {}
    sets = [(path.name, read_labelled(path)) for path in datasets]
    if args.pooled and len(sets) > 1:
        sets.append(("pooled(" + " + ".join(name for name, _ in sets) + ")", [r for _, rows in sets for r in rows]))
    if args.unseen:
        from meshlm.safety.encoder_judge import shipped_training_rows

        seen = {str(r.get("prompt", "")).strip().lower() for r in shipped_training_rows()}
        everything = [r for _, rows in sets[:len(datasets)] for r in rows]
        sets.append(("unseen prompts", [r for r in everything if r.get("prompt", "").strip().lower() not in seen]))
    for spec, judge in judges:
        for name, rows in sets:
            result = bench(judge, rows)
            report[f"{spec} @ {name}"] = {k: v for k, v in result.items() if k != "errors"}
            if not args.json:
                print_block(spec, name, result, args.errors and name.endswith(".jsonl"))
    if args.json:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
