"""The judges side by side on labelled sets: accuracy with its Wilson 95% interval and per-label precision and
recall, per set and pooled per group, written as JSON and as a markdown table.

    python scripts/bench_judges_sealed.py --out bench/judges_sealed            # rule, encoder on every sealed set
    python scripts/bench_judges_sealed.py --judge rule --judge encoder --judge encoder:DIR --out OUT
    python scripts/bench_judges_sealed.py --data a.jsonl --data b.jsonl --judge encoder:DIR --out OUT  # dev sets
    python scripts/bench_judges_sealed.py ... --head-only     # also each judge without the degenerate-text check
    python scripts/bench_judges_sealed.py --judge encoder:NEW --reuse OUT.json --out OUT2   # earlier results kept

With no --data, the sets are the sealed judge sets of meshlm/safety/evalsets.toml in two groups: the responses of
real small models (files matching --real, default ``*smollm2*``) and the writers' own responses (the others). A
sealed set is never tuned on: run this on the final candidates once. Writes OUT.json (every figure, the
confusion matrices, each set's sha256) and OUT.md (one table row per group or set and judge). Pooled figures are
summed from the sets' confusion matrices; --reuse keeps an earlier report's results of unchanged sets.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_judge import DATA, read_labelled  # noqa: E402

from meshlm.fileio import atomic_write_text, sha256_file  # noqa: E402
from meshlm.safety import evalsets  # noqa: E402
from meshlm.safety.judges import make_judge  # noqa: E402
from meshlm.safety.metrics import wilson  # noqa: E402
from meshlm.safety.taxonomy import LABELS  # noqa: E402


def confusion(rows: list[dict], predicted: list[str]) -> dict:
    """{true label: {judged label: count}}."""
    matrix = {t: {p: 0 for p in LABELS} for t in LABELS}
    for row, label in zip(rows, predicted):
        matrix[row["label"]][label] += 1
    return matrix


def scores(matrix: dict) -> dict:
    """Accuracy [Wilson 95%], per-label precision and recall (each with its counts and interval), from a
    confusion matrix (so that a pooled figure is the sum of its sets' matrices)."""
    n = sum(sum(row.values()) for row in matrix.values())
    correct = sum(matrix[t][t] for t in LABELS)
    per_label = {}
    for label in LABELS:
        hits, truly = matrix[label][label], sum(matrix[label].values())
        said = sum(matrix[t][label] for t in LABELS)
        per_label[label] = {"precision": _rate(hits, said), "recall": _rate(hits, truly), "n": truly}
    return {"n": n, "correct": correct, "accuracy": correct / n if n else None,
            "ci95": list(wilson(correct, n)), "labels": per_label, "confusion": matrix}


def _rate(k: int, n: int) -> dict:
    return {"value": k / n if n else None, "k": k, "n": n, "ci95": list(wilson(k, n))}


def groups(real_pattern: str, data: list[Path] | None) -> dict[str, list[Path]]:
    """{group: files}: the given files as one group, or the sealed judge sets as 'real' and 'writers'."""
    if data:
        return {"given": data}
    sealed = [DATA / name for name in evalsets.names("judge", "sealed")]
    real = [p for p in sealed if fnmatch.fnmatch(p.name, real_pattern)]
    return {"sealed real-model responses": real, "writers' sealed sets": [p for p in sealed if p not in real]}


def run(judges: list[str], sets: dict[str, list[Path]], head_only: bool, reuse: list[dict]) -> dict:
    """Every judge on every set, then each group pooled: {"results": [{judge, group, set, sha256, ...scores}]}.
    A (judge, set) result of ``reuse`` (an earlier report's) whose set has the same sha256 is kept, not rerun."""
    known = {(r["judge"], r["set"], r["sha256"]): r for r in reuse if r.get("sha256")}
    digest = {path: sha256_file(path) for files in sets.values() for path in files}
    results, loaded = [], {}
    for spec in judges:
        names = [spec] + ([f"{spec} (head only)"] if head_only else [])
        for name in names:
            for group, files in sets.items():
                matrices = []
                for path in files:
                    result = known.get((name, path.name, digest[path]))
                    if result is None:
                        judge = loaded.setdefault(spec, make_judge(spec))
                        call = judge.classify if name.endswith("(head only)") else judge.label
                        rows, start = read_labelled(path), time.perf_counter()
                        matrix = confusion(rows, call([r.get("prompt", "") for r in rows], [r["response"] for r in rows]))
                        result = {"judge": name, "set": path.name, "sha256": digest[path],
                                  "seconds": round(time.perf_counter() - start, 2), **scores(matrix)}
                    results.append({**result, "group": group})
                    matrices.append(result["confusion"])
                if len(files) > 1:
                    pooled = {t: {p: sum(m[t][p] for m in matrices) for p in LABELS} for t in LABELS}
                    results.append({"judge": name, "group": group, "set": "pooled", **scores(pooled)})
                print(f"{name} @ {group}: done", file=sys.stderr, flush=True)
    return {"judges": judges, "sets": {g: [p.name for p in f] for g, f in sets.items()}, "results": results}


def _fmt(rate: dict) -> str:
    return "–" if rate["value"] is None else f"{rate['value']:.2f} ({rate['k']}/{rate['n']})"


def markdown(report: dict) -> str:
    head = ["group", "set", "judge", "n", "accuracy [95% CI]"] + [f"{lab} P / R" for lab in LABELS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in report["results"]:
        lo, hi = r["ci95"]
        cells = [r["group"], r["set"], r["judge"], str(r["n"]), f"{r['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]"]
        cells += [f"{_fmt(r['labels'][lab]['precision'])} / {_fmt(r['labels'][lab]['recall'])}" for lab in LABELS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--judge", action="append", help="a --judge spec (repeatable; default rule and encoder)")
    parser.add_argument("--data", action="append", type=Path, help="labelled JSONL instead of the sealed sets")
    parser.add_argument("--real", default="*smollm2*", help="file pattern of the real-model sealed sets")
    parser.add_argument("--head-only", action="store_true",
                        help="also score each judge without the degenerate-text check (its classify alone)")
    parser.add_argument("--out", required=True, type=Path, help="OUT: writes OUT.json and OUT.md")
    parser.add_argument("--reuse", type=Path, help="an earlier OUT.json: its (judge, set) results whose set is "
                                                   "unchanged (sha256) are kept, not rerun")
    args = parser.parse_args()
    sets = groups(args.real, args.data)
    missing = [str(p) for files in sets.values() for p in files if not p.is_file()]
    if missing:
        sys.exit(f"no such labelled set: {', '.join(missing)}")
    reuse = json.loads(args.reuse.read_text())["results"] if args.reuse else []
    report = run(args.judge or ["rule", "encoder"], sets, args.head_only, reuse)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(report, indent=2) + "\n")
    atomic_write_text(args.out.with_suffix(".md"), markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
