"""Per-type recall and precision of the audit-log sanitizer on a labelled PII set (default tests/data/pii_eval.jsonl).

A gold span is *found* when a finding of the same type overlaps it, and *fully masked* when findings (of any
type) cover all of its characters — nothing of it would reach the audit log. A finding is a *false positive*
when it overlaps no gold span of its type (look-alike rows — versions, hashes, UUIDs, order numbers,
invalid-checksum cards — have no gold spans, so anything found there counts). Also prints sanitize() speed.

    .venv/bin/python scripts/bench_sanitizer.py [--data FILE] [--split dev|check] [--json] [--presidio] [--audit]

The set's ``dev`` rows were written first and the recognisers tuned on them; the ``check`` rows were written after
the first version and scored once before any change (docs/audit.md gives both).

``--presidio`` adds Microsoft Presidio's pattern recognisers (no spaCy model) on the same rows, for comparison;
it needs ``pip install presidio-analyzer`` and is not a dependency of meshlm (docs/audit.md says why).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshlm.serve.sanitize import PII_TYPES, find_pii, sanitize  # noqa: E402

STRUCTURED = ("EMAIL", "PHONE", "CREDIT_CARD", "IBAN", "IP_ADDRESS", "US_SSN", "API_KEY", "DATE_OF_BIRTH",
              "ACCOUNT_NUMBER", "PASSPORT", "DRIVER_LICENSE", "TAX_ID", "NATIONAL_ID", "CVV")
TARGETS = {t: 0.99 for t in STRUCTURED} | {"PERSON": 0.90, "STREET_ADDRESS": 0.90}


def load_rows(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for row in rows:
        for s in row["spans"]:
            assert row["text"][s["start"]:s["end"]] == s["value"], (row["id"], s)
    return rows


def score(rows: list[dict], detect) -> dict:
    """Per-type counts and rates; ``detect(text)`` returns ``(start, end, type)`` findings."""
    c: dict[str, dict[str, int]] = defaultdict(lambda: {"gold": 0, "found": 0, "masked": 0, "predicted": 0, "fp": 0})
    misses, false_positives, partial = [], [], []
    for row in rows:
        text, gold = row["text"], row["spans"]
        found = list(detect(text))
        covered = set()
        for s, e, _ in found:
            covered.update(range(s, e))
        for g in gold:
            stats = c[g["type"]]
            stats["gold"] += 1
            hit = any(t == g["type"] and s < g["end"] and e > g["start"] for s, e, t in found)
            stats["found"] += hit
            masked = all(i in covered for i in range(g["start"], g["end"]))
            stats["masked"] += masked
            if hit and not masked:
                partial.append({"id": row["id"], "type": g["type"], "value": g["value"],
                                "left": "".join(ch for i, ch in enumerate(g["value"], g["start"]) if i not in covered)})
            if not hit:
                misses.append({"id": row["id"], "type": g["type"], "value": g["value"]})
        for s, e, t in found:
            c[t]["predicted"] += 1
            if not any(g["type"] == t and s < g["end"] and e > g["start"] for g in gold):
                c[t]["fp"] += 1
                false_positives.append({"id": row["id"], "type": t, "value": text[s:e]})
    per_type = {}
    for t in PII_TYPES:
        x = c[t]
        per_type[t] = {**x, "recall": x["found"] / x["gold"] if x["gold"] else None,
                       "masked_rate": x["masked"] / x["gold"] if x["gold"] else None,
                       "precision": (x["predicted"] - x["fp"]) / x["predicted"] if x["predicted"] else None,
                       "recall_target": TARGETS[t]}
    lookalike_rows = [r for r in rows if not r["spans"]]
    clean = sum(not list(detect(r["text"])) for r in lookalike_rows)
    return {"per_type": per_type, "lookalike_rows": len(lookalike_rows), "lookalike_rows_left_alone": clean,
            "misses": misses, "false_positives": false_positives, "partially_masked": partial}


def ours(text: str):
    return [(f.start, f.end, f.type) for f in find_pii(text)]


def presidio_detector():
    """Presidio's predefined pattern recognisers behind an NLP engine that loads no model."""
    from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
    from presidio_analyzer.nlp_engine import NlpArtifacts, NlpEngine
    from presidio_analyzer.predefined_recognizers import (CreditCardRecognizer, EmailRecognizer, IbanRecognizer,
                                                          IpRecognizer, PhoneRecognizer, UsSsnRecognizer)

    class NoModel(NlpEngine):
        def load(self): pass
        def is_loaded(self): return True
        def process_text(self, text, language):
            return NlpArtifacts(entities=[], tokens=[], tokens_indices=[], lemmas=[], nlp_engine=self,
                                language=language)
        def process_batch(self, texts, language, **kwargs):
            return ((t, self.process_text(t, language)) for t in texts)
        def is_stopword(self, word, language): return False
        def is_punct(self, word, language): return False
        def get_supported_entities(self): return []
        def get_supported_languages(self): return ["en"]

    registry = RecognizerRegistry()
    for r in (CreditCardRecognizer(), EmailRecognizer(), IbanRecognizer(), IpRecognizer(), PhoneRecognizer(),
              UsSsnRecognizer()):
        registry.add_recognizer(r)
    engine = AnalyzerEngine(registry=registry, nlp_engine=NoModel(), supported_languages=["en"])
    names = {"EMAIL_ADDRESS": "EMAIL", "PHONE_NUMBER": "PHONE", "CREDIT_CARD": "CREDIT_CARD", "IBAN_CODE": "IBAN",
             "IP_ADDRESS": "IP_ADDRESS", "US_SSN": "US_SSN"}
    return lambda text: [(r.start, r.end, names[r.entity_type]) for r in engine.analyze(text, language="en")
                         if r.entity_type in names and r.score >= 0.4]


def audit_append_rate(texts: list[str], num_records: int = 400, num_threads: int = 4) -> dict:
    """Records/s appended to a fresh AuditLog (sanitize + chain + one fsync'd transaction each), one thread and
    ``num_threads`` threads, with the eval rows as prompts."""
    import tempfile
    import threading

    from meshlm.serve.audit import AuditLog
    from meshlm.serve.audit_verify import verify

    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for threads in (1, num_threads):
            path = Path(tmp) / f"bench-{threads}.db"
            log = AuditLog(path)
            per_thread = num_records // threads

            def work(t: int) -> None:
                for i in range(per_thread):
                    log.append({"kind": "request", "request_id": f"{t}-{i}", "prompt": texts[i % len(texts)],
                                "response": texts[(i + 7) % len(texts)], "status": 200})

            start = time.perf_counter()
            workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            elapsed = time.perf_counter() - start
            log.close()
            assert verify(path).ok
            result[f"records_per_s_{threads}_threads"] = per_thread * threads / elapsed
    return result


def fmt(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def print_table(name: str, result: dict) -> None:
    print(f"\n{name}")
    print(f"{'type':<15} {'gold':>5} {'recall':>7} {'masked':>7} {'pred':>5} {'FP':>4} {'precision':>9} {'target':>7}")
    for t, x in result["per_type"].items():
        print(f"{t:<15} {x['gold']:>5} {fmt(x['recall']):>7} {fmt(x['masked_rate']):>7} {x['predicted']:>5} "
              f"{x['fp']:>4} {fmt(x['precision']):>9} {fmt(x['recall_target']):>7}")
    print(f"look-alike rows left alone: {result['lookalike_rows_left_alone']}/{result['lookalike_rows']}")
    for m in result["misses"]:
        print(f"  missed  #{m['id']:<4} {m['type']:<15} {m['value']!r}")
    for m in result["partially_masked"]:
        print(f"  partial #{m['id']:<4} {m['type']:<15} {m['value']!r} left {m['left']!r}")
    for m in result["false_positives"]:
        print(f"  false + #{m['id']:<4} {m['type']:<15} {m['value']!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT / "tests" / "data" / "pii_eval.jsonl")
    ap.add_argument("--split", choices=["dev", "check"], help="only rows of this split (default: all)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--presidio", action="store_true", help="also score Presidio's pattern recognisers")
    ap.add_argument("--audit", action="store_true", help="also time AuditLog.append (records/s, 1 and 4 threads)")
    args = ap.parse_args()
    rows = [r for r in load_rows(args.data) if args.split is None or r.get("split") == args.split]
    report = {"data": str(args.data), "rows": len(rows), "meshlm": score(rows, ours)}
    texts = [r["text"] for r in rows]
    start = time.perf_counter()
    for _ in range(5):
        for t in texts:
            sanitize(t)
    report["meshlm"]["us_per_row"] = (time.perf_counter() - start) / (5 * len(texts)) * 1e6
    if args.audit:
        report["audit"] = audit_append_rate(texts)
    if args.presidio:
        start = time.perf_counter()
        detect = presidio_detector()
        report["presidio_setup_s"] = time.perf_counter() - start
        report["presidio"] = score(rows, detect)
        start = time.perf_counter()
        for t in texts:
            detect(t)
        report["presidio"]["us_per_row"] = (time.perf_counter() - start) / len(texts) * 1e6
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{len(rows)} rows from {args.data}")
    print_table(f"meshlm sanitizer ({report['meshlm']['us_per_row']:.0f} us per row)", report["meshlm"])
    if args.audit:
        print("\naudit log appends: " + ", ".join(f"{k} {v:.0f}" for k, v in report["audit"].items()))
    if args.presidio:
        print_table(f"Presidio pattern recognisers, structured types only ({report['presidio']['us_per_row']:.0f} "
                    f"us per row, setup {report['presidio_setup_s']:.2f} s)", report["presidio"])


if __name__ == "__main__":
    main()
