"""``meshlm audit verify|export|keygen|rotate-key`` (docs/audit.md)."""

from __future__ import annotations

import argparse
import json

from meshlm.cli.jsonout import emit

_KEY_HELP = ("a file holding the audit key (repeat for the keys of earlier rotations; default "
             "$MESHLM_AUDIT_KEY_FILE or $MESHLM_AUDIT_KEY)")


def register(sub, add_config_args) -> None:
    p = sub.add_parser("audit", help="verify, export or re-key a sanitized, hash-chained audit log")
    asub = p.add_subparsers(dest="audit_command", required=True, metavar="{verify,export,keygen,rotate-key}")
    ver = asub.add_parser("verify", help="recompute the hash chain; name every modified, deleted or reordered "
                                         "record; exit 1 when the chain is broken, 2 when a keyed log's key is "
                                         "missing")
    ver.add_argument("db", metavar="DB", help="the audit database (`meshlm serve --audit DB`)")
    ver.add_argument("--key-file", action="append", default=[], metavar="FILE", help=_KEY_HELP)
    ver.add_argument("--json", action="store_true", help="print the report as one JSON object")
    ver.set_defaults(handler=run_verify)
    exp = asub.add_parser("export", help="print the records as one JSON list, oldest first")
    exp.add_argument("db", metavar="DB")
    exp.add_argument("--since", metavar="T", help="only records at or after this ISO-8601 time "
                                                  "(e.g. 2026-11-30T21:00:00Z; no zone means UTC)")
    exp.add_argument("--json", action="store_true", help="compact JSON (the default is indented)")
    exp.set_defaults(handler=run_export)
    gen = asub.add_parser("keygen", help="write a new random audit key to a new owner-only file")
    gen.add_argument("file", metavar="FILE")
    gen.add_argument("--json", action="store_true", help="print {file, key_id} as JSON")
    gen.set_defaults(handler=run_keygen)
    rot = asub.add_parser("rotate-key", help="chain a rotate_key record and key every later record with a new "
                                             "key (also keys an unkeyed log); stop the server first")
    rot.add_argument("db", metavar="DB")
    rot.add_argument("--key-file", metavar="FILE", help="the current key (default $MESHLM_AUDIT_KEY_FILE or "
                                                        "$MESHLM_AUDIT_KEY; none for an unkeyed log)")
    rot.add_argument("--new-key-file", metavar="FILE", required=True, help="the new key (`meshlm audit keygen`)")
    rot.add_argument("--json", action="store_true", help="print the rotation record as JSON")
    rot.set_defaults(handler=run_rotate)


def _keys(files: list[str]) -> list[bytes]:
    from meshlm.serve.audit_keys import key_from_env, read_key_file

    if files:
        return [read_key_file(f) for f in files]
    key = key_from_env()
    return [key] if key is not None else []


def run_verify(args: argparse.Namespace) -> int:
    from meshlm.serve.audit_verify import verify

    report = verify(args.db, _keys(args.key_file))
    keys = ", ".join(k or "unkeyed" for k in report.key_ids)
    if args.json:
        emit(report.to_json())
    elif report.ok:
        print(f"{args.db}: chain intact ({report.mode}, key ids: {keys}), {report.records} records, head seq "
              f"{report.head_seq} hash {report.head_hash}")
    else:
        print(f"{args.db}: chain BROKEN ({len(report.problems)} problems in {report.records} records, "
              f"{report.mode})")
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


def run_keygen(args: argparse.Namespace) -> int:
    from meshlm.serve.audit_keys import key_id, write_new_key

    kid = key_id(write_new_key(args.file))
    if args.json:
        emit({"file": args.file, "key_id": kid})
    else:
        print(f"{args.file}: new audit key, id {kid} (keep it off the machine that holds the database's backups)")
    return 0


def run_rotate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from meshlm.serve.audit import AuditLog
    from meshlm.serve.audit_keys import read_key_file
    from meshlm.serve.audit_verify import open_existing

    open_existing(args.db).close()  # a missing or foreign file is refused, never created
    old = _keys([args.key_file] if args.key_file else [])
    new = read_key_file(args.new_key_file, "--new-key-file")
    with AuditLog(Path(args.db), key=old[0] if old else None) as log:
        record = log.rotate_key(new)
    if args.json:
        emit(record)
    else:
        print(f"{args.db}: record {record['seq']} rotates the key {record['from_key_id'] or '(unkeyed)'} -> "
              f"{record['to_key_id']}; later records are chained with the new key")
    return 0
