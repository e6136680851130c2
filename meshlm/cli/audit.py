"""``meshlm audit verify DB [--json]`` and ``meshlm audit export DB [--since T] [--json]`` (docs/audit.md)."""

from __future__ import annotations

import argparse
import json

from meshlm.cli.jsonout import emit


def register(sub, add_config_args) -> None:
    p = sub.add_parser("audit", help="verify or export a sanitized, hash-chained audit log")
    asub = p.add_subparsers(dest="audit_command", required=True, metavar="{verify,export}")
    ver = asub.add_parser("verify", help="recompute the hash chain; name every modified, deleted or reordered "
                                         "record; exit 1 when the chain is broken")
    ver.add_argument("db", metavar="DB", help="the audit database (`meshlm serve --audit DB`)")
    ver.add_argument("--json", action="store_true", help="print the report as one JSON object")
    ver.set_defaults(handler=run_verify)
    exp = asub.add_parser("export", help="print the records as one JSON list, oldest first")
    exp.add_argument("db", metavar="DB")
    exp.add_argument("--since", metavar="T", help="only records at or after this ISO-8601 time "
                                                  "(e.g. 2026-11-30T21:00:00Z; no zone means UTC)")
    exp.add_argument("--json", action="store_true", help="compact JSON (the default is indented)")
    exp.set_defaults(handler=run_export)


def run_verify(args: argparse.Namespace) -> int:
    from meshlm.serve.audit_verify import verify

    report = verify(args.db)
    if args.json:
        emit(report.to_json())
    elif report.ok:
        print(f"{args.db}: chain intact, {report.records} records, head seq {report.head_seq} "
              f"hash {report.head_hash}")
    else:
        print(f"{args.db}: chain BROKEN ({len(report.problems)} problems in {report.records} records)")
        for p in report.problems:
            print(f"  record {p.seq}: {p.kind}: {p.detail}")
    return 0 if report.ok else 1


def run_export(args: argparse.Namespace) -> int:
    from meshlm.serve.audit_verify import export

    records = export(args.db, args.since)
    if args.json:
        emit(records)
    else:
        print(json.dumps(records, indent=2, ensure_ascii=False))
    return 0
