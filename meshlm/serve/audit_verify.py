"""Reading an audit log back: verify its hash chain (naming the broken records) and export it.

Verification recomputes every hash from the genesis and also checks each record locally, so that it can say
*which* record was modified (its stored hash no longer matches its body, or the next record's ``prev_hash`` no
longer matches it), deleted (a sequence number is missing, or the head kept in ``meta`` is past the last row),
reordered (a record's own ``seq`` differs from its place, or sequence numbers go backwards) or duplicated.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from meshlm.errors import UserError
from meshlm.serve.audit import GENESIS_HASH, chain_hash, connect, normalize_time


class AuditLogError(UserError):
    """A missing or unreadable audit database."""


@dataclass
class Problem:
    seq: int  # the record the problem is about (its claimed or expected sequence number)
    kind: str  # modified | deleted | reordered | duplicated | unreadable
    detail: str

    def to_json(self) -> dict:
        return {"seq": self.seq, "problem": self.kind, "detail": self.detail}


@dataclass
class VerifyReport:
    path: str
    records: int = 0
    head_seq: int = 0
    head_hash: str = GENESIS_HASH
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {"path": self.path, "ok": self.ok, "records": self.records, "head_seq": self.head_seq,
                "head_hash": self.head_hash, "first_bad_seq": min((p.seq for p in self.problems), default=None),
                "problems": [p.to_json() for p in self.problems]}


def open_existing(path: str | Path) -> sqlite3.Connection:
    path = Path(path)
    if not path.is_file():
        raise AuditLogError(f"audit database {path} does not exist; pass the file given to `meshlm serve --audit`")
    try:
        conn = connect(path, create=False)
        conn.execute("SELECT seq, time, kind, body, prev_hash, hash FROM records LIMIT 1").fetchall()
        return conn
    except sqlite3.DatabaseError as exc:
        raise AuditLogError(f"{path} is not a meshlm audit database ({exc})") from None


def _rows(conn: sqlite3.Connection) -> tuple[list[tuple], dict | None]:
    conn.execute("BEGIN")  # one read snapshot: rows and head agree even while a server appends
    try:
        rows = conn.execute("SELECT seq, time, kind, body, prev_hash, hash FROM records ORDER BY seq").fetchall()
        head = conn.execute("SELECT value FROM meta WHERE key = 'head'").fetchone()
    finally:
        conn.execute("COMMIT")
    return rows, json.loads(head[0]) if head else None


def verify(path: str | Path) -> VerifyReport:
    """Check the whole chain of the log at ``path``; an empty problem list means intact."""
    conn = open_existing(path)
    try:
        rows, head = _rows(conn)
    finally:
        conn.close()
    report = VerifyReport(str(path), records=len(rows))
    problems = report.problems
    expected_prev, prev_stored_hash, prev_claimed, seen = GENESIS_HASH, GENESIS_HASH, 0, set()
    for position, (seq, time, kind, body_text, prev_hash, stored_hash) in enumerate(rows, start=1):
        try:
            body = json.loads(body_text)
            claimed = int(body["seq"])
        except (ValueError, KeyError, TypeError):
            problems.append(Problem(seq, "modified", f"record at row seq {seq} is not valid JSON with a seq"))
            expected_prev, prev_stored_hash = stored_hash, stored_hash
            continue
        if claimed in seen:
            problems.append(Problem(claimed, "duplicated", f"record {claimed} appears again at row seq {seq}"))
        elif claimed < prev_claimed or claimed != seq:
            problems.append(Problem(claimed, "reordered", f"record {claimed} is stored at position {seq}"))
        elif claimed > prev_claimed + 1:
            for missing in range(prev_claimed + 1, claimed):
                problems.append(Problem(missing, "deleted", f"record {missing} is missing (before record {claimed})"))
        seen.add(claimed)
        if chain_hash(prev_hash, body) != stored_hash:
            problems.append(Problem(claimed, "modified", f"record {claimed}'s content does not match its hash"))
        elif prev_hash != prev_stored_hash and claimed == prev_claimed + 1:
            problems.append(Problem(prev_claimed, "modified", f"record {prev_claimed}'s hash was rewritten "
                                    f"(record {claimed} chains to a different one)"))
        elif (time, kind) != (body.get("time"), body.get("kind")):
            problems.append(Problem(claimed, "modified", f"record {claimed}'s time/kind columns differ from it"))
        # The recomputed chain: any change upstream shows here even when the local checks above pass.
        expected_prev = chain_hash(expected_prev, body)
        prev_stored_hash, prev_claimed = stored_hash, max(prev_claimed, claimed)
    report.head_seq, report.head_hash = prev_claimed, expected_prev
    if head is not None and (head["seq"] > prev_claimed or head["hash"] != prev_stored_hash) and not any(
            p.kind in ("reordered", "duplicated") for p in problems):
        for missing in range(prev_claimed + 1, head["seq"] + 1):
            problems.append(Problem(missing, "deleted", f"record {missing} is missing (the log's head is "
                                    f"record {head['seq']})"))
        if head["seq"] <= prev_claimed:
            problems.append(Problem(prev_claimed, "modified", "the newest record does not match the stored head"))
    elif head is None and rows:
        problems.append(Problem(0, "modified", "the stored head is missing"))
    if not problems and expected_prev != prev_stored_hash:  # cannot happen unless the checks above miss a case
        problems.append(Problem(prev_claimed, "modified", "the recomputed chain does not reach the stored head"))
    problems.sort(key=lambda p: p.seq)
    return report


def export(path: str | Path, since: str | None = None) -> list[dict]:
    """Every record (with ``seq``, ``prev_hash`` and ``hash``), oldest first; ``since``: ISO time, inclusive."""
    cutoff = None
    if since is not None:
        try:
            cutoff = normalize_time(since)
        except ValueError:
            raise AuditLogError(f"--since {since!r} is not an ISO-8601 time (e.g. 2026-11-30T21:00:00Z)") from None
    conn = open_existing(path)
    try:
        query = "SELECT body, prev_hash, hash FROM records"
        args: tuple = ()
        if cutoff is not None:
            query, args = query + " WHERE time >= ?", (cutoff,)
        rows = conn.execute(query + " ORDER BY seq", args).fetchall()
    finally:
        conn.close()
    return [{**json.loads(body), "prev_hash": prev_hash, "hash": digest} for body, prev_hash, digest in rows]
