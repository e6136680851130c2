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

from meshlm.serve.audit import GENESIS_HASH, AuditLogError, chain_hash, connect, normalize_time


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
    conn = connect(path, create=False)
    try:
        conn.execute("SELECT seq, time, kind, body, prev_hash, hash FROM records LIMIT 1").fetchall()
        return conn
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise AuditLogError(f"{path} is not a meshlm audit database ({exc})") from None


def verify(path: str | Path) -> VerifyReport:
    """Check the whole chain of the log at ``path``; an empty problem list means intact."""
    conn = open_existing(path)
    try:
        conn.execute("BEGIN")  # one read snapshot: rows and head agree even while a server appends
        head_row = conn.execute("SELECT value FROM meta WHERE key = 'head'").fetchone()
        rows = conn.execute("SELECT seq, time, kind, body, prev_hash, hash FROM records ORDER BY seq")
        report = _check(str(path), rows, json.loads(head_row[0]) if head_row else None)
        conn.execute("COMMIT")
    finally:
        conn.close()
    return report


def _check(path: str, rows, head: dict | None) -> VerifyReport:
    """The checks, streaming over the rows (only each record's two hashes are kept, not its body)."""
    report = VerifyReport(path)
    problems = report.problems
    by_claim: dict[int, tuple[str, str]] = {}  # a record's own seq -> (prev_hash, hash)
    expected = GENESIS_HASH
    for seq, time, kind, body_text, prev_hash, stored_hash in rows:
        report.records += 1
        try:
            body = json.loads(body_text)
            claimed = int(body["seq"])
        except (ValueError, KeyError, TypeError):
            problems.append(Problem(seq, "modified", f"the record at position {seq} is not JSON with a seq"))
            continue
        if claimed in by_claim:
            problems.append(Problem(claimed, "duplicated", f"record {claimed} appears again at position {seq}"))
            continue
        by_claim[claimed] = (prev_hash, stored_hash)
        if claimed != seq:
            problems.append(Problem(claimed, "reordered", f"record {claimed} is stored at position {seq}"))
        if chain_hash(prev_hash, body) != stored_hash:
            problems.append(Problem(claimed, "modified", f"record {claimed}'s content does not match its hash"))
        elif (time, kind) != (body.get("time"), body.get("kind")):
            problems.append(Problem(claimed, "modified", f"record {claimed}'s time/kind columns differ from it"))
        expected = chain_hash(expected, body)  # the chain recomputed from the genesis, in stored order
    last = max(by_claim, default=0)
    head_seq = max(last, head["seq"] if head else 0)
    for missing in sorted(set(range(1, head_seq + 1)) - set(by_claim)):
        problems.append(Problem(missing, "deleted", f"record {missing} is missing (the log's head is record "
                                f"{head_seq})"))
    # Links, in each record's own order: record k must chain to the hash stored with record k-1.
    for claimed, (prev_hash, _) in sorted(by_claim.items()):
        before = GENESIS_HASH if claimed == 1 else by_claim.get(claimed - 1, (None, None))[1]
        if before is not None and prev_hash != before:
            problems.append(Problem(claimed - 1, "modified", f"record {claimed - 1}'s hash was rewritten "
                                    f"(record {claimed} chains to a different one)"))
    if head is None and report.records:
        problems.append(Problem(0, "modified", "the log's stored head is missing"))
    elif head is not None and head["seq"] == last and last and head["hash"] != by_claim[last][1]:
        problems.append(Problem(last, "modified", f"record {last}'s hash differs from the stored head"))
    report.head_seq, report.head_hash = last, expected
    if not problems and (by_claim and expected != by_claim[last][1]):  # every break shows above; belt and braces
        problems.append(Problem(last, "modified", "the recomputed chain does not reach the newest record"))
    problems.sort(key=lambda p: (p.seq, p.kind))
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
