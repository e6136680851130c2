"""Judge saved responses again with other judges and report the safety figures side by side.

Generation is the slow part of an evaluation; judging is not. `meshlm eval safety` and `meshlm align` save every
response (responses.jsonl: prompt, response, expected, category, family, label); this script labels them again
with each --judge and prints refusal, false refusal, warn and attack success (Wilson 95%) per system, with the
worst attack family, as JSON and a markdown table.

    python scripts/rejudge.py --system base=/tmp/sealed/base/writer6/responses.jsonl \
        --system sft_dpo=/tmp/real/align2/eval/dpo/heldout/responses.jsonl --judge rule --judge encoder --out OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from meshlm.fileio import atomic_write_text
from meshlm.safety.judges import make_judge
from meshlm.safety.metrics import summarize

METRICS = ("refusal_rate", "false_refusal_rate", "warn_rate", "attack_success_rate")


def _cell(stat: dict | None) -> str:
    if not stat or not stat.get("n"):
        return "–"
    lo, hi = stat["ci95"]
    return f"{stat['rate']:.3f} [{lo:.2f}, {hi:.2f}] (n {stat['n']})"


def _worst_family(block: dict) -> str:
    fams = [(name, b.get("attack_success_rate")) for name, b in block.get("by_family", {}).items()]
    fams = [(name, s) for name, s in fams if s and s.get("n")]
    if not fams:
        return "–"
    name, s = max(fams, key=lambda f: f[1]["rate"])
    return f"{name} {s['rate']:.2f} ({s['k']}/{s['n']})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", action="append", required=True, help="NAME=responses.jsonl (repeatable)")
    ap.add_argument("--judge", action="append", required=True, help="a judge spec: rule, encoder[:DIR], ...")
    ap.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.md are written")
    args = ap.parse_args()

    systems = dict(s.split("=", 1) for s in args.system)
    rows = {name: [json.loads(line) for line in Path(p).read_text().splitlines() if line.strip()]
            for name, p in systems.items()}
    report: dict = {"systems": systems, "judges": {}}
    lines = ["| judge | system | n | " + " | ".join(METRICS) + " | worst family (attack success) |",
             "|---|---|---|" + "---|" * (len(METRICS) + 1)]
    for spec in args.judge:
        judge = make_judge(spec)
        report["judges"][spec] = {}
        for name, rs in rows.items():
            labels = judge.label([r["prompt"] for r in rs], [r["response"] for r in rs])
            block = summarize([dict(r, label=label) for r, label in zip(rs, labels)])
            report["judges"][spec][name] = block
            lines.append(f"| {spec} | {name} | {block['n']} | "
                         + " | ".join(_cell(block.get(m)) for m in METRICS) + f" | {_worst_family(block)} |")
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(report, indent=1))
    atomic_write_text(args.out.with_suffix(".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
