"""Reading an audit log back: verify its hash chain (naming the broken records) and export it.

Verification recomputes every hash from the genesis and also checks each record locally, so that it can say
*which* record was modified (its stored hash no longer matches its body, or the next record's ``prev_hash`` no
longer matches it), deleted (a sequence number is missing, or the head kept in ``meta`` is past the last row),
reordered (a record's own ``seq`` differs from its place, or sequence numbers go backwards) or duplicated.

A keyed log (``hmac-sha256``) is verified with its keys: the key of each stretch of the chain is named by the
log (``first_key_id``, then each ``rotate_key`` record's ``to_key_id``), and the head's tag must match under the
newest key. Without a key a keyed log cannot be verified (:class:`AuditLogError`, exit 2); a key given for an
unkeyed log is a problem (a log rewritten without the key would look unkeyed).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from meshlm.serve.audit import (GENESIS_HASH, AuditLogError, chain_hash, chain_mode, connect, normalize_time,
                                read_meta)
from meshlm.serve.audit_keys import MODE_KEYED, MODE_PLAIN, KEY_ENV, head_tag, key_id


@dataclass
class Problem:
    seq: int  # the record the problem is about (its claimed or expected sequence number)
    kind: str  # modified | deleted | reordered | duplicated | unkeyed
    detail: str

    def to_json(self) -> dict:
        return {"seq": self.seq, "problem": self.kind, "detail": self.detail}


@dataclass
class VerifyReport:
    path: str
    records: int = 0
    head_seq: int = 0
    head_hash: str = GENESIS_HASH
    mode: str = MODE_PLAIN
    key_ids: list[str | None] = field(default_factory=list)  # each stretch's key id, oldest first (None: unkeyed)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {"path": self.path, "ok": self.ok, "records": self.records, "head_seq": self.head_seq,
                "head_hash": self.head_hash, "mode": self.mode, "key_ids": self.key_ids,
                "first_bad_seq": min((p.seq for p in self.problems), default=None),
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


def verify(path: str | Path, keys: list[bytes] | tuple[bytes, ...] = ()) -> VerifyReport:
    """Check the whole chain of the log at ``path``; an empty problem list means intact. ``keys``: every key the
    log was written with (a keyed log names the ids it needs)."""
    conn = open_existing(path)
    try:
        conn.execute("BEGIN")  # one read snapshot: rows and head agree even while a server appends
        meta = read_meta(conn)
        rows = conn.execute("SELECT seq, time, kind, body, prev_hash, hash FROM records ORDER BY seq")
        keyring = _Keyring(str(path), meta, {key_id(k): k for k in keys})
        report = _check(str(path), rows, json.loads(meta["head"]) if "head" in meta else None, keyring)
        conn.execute("COMMIT")
    finally:
        conn.close()
    return report


class _Keyring:
    """Which key each record was chained with: the log's first key, then each rotation's new key."""

    def __init__(self, path: str, meta: dict[str, str], keys: dict[str, bytes]) -> None:
        self.path, self.meta, self.keys = path, meta, keys
        self.mode = chain_mode(meta)
        if self.mode not in (MODE_PLAIN, MODE_KEYED):
            raise AuditLogError(f"{path}: unknown chain mode {self.mode!r}; upgrade meshlm")
        if self.mode == MODE_KEYED and not keys:
            raise AuditLogError(f"{path} is a keyed (hmac-sha256) audit log, key id {meta.get('key_id')}: give its "
                                f"key to verify it (--key-file FILE, repeat for older keys, or ${KEY_ENV})")
        self.current_id: str | None = meta.get("first_key_id") if self.mode == MODE_KEYED else None
        self.ids: list[str | None] = [self.current_id]
        self.key = self._lookup(self.current_id, 1)

    def _lookup(self, kid: str | None, seq: int) -> bytes | None:
        if kid is None:
            return None
        if kid not in self.keys:
            given = ", ".join(sorted(self.keys)) or "none"
            raise AuditLogError(f"{self.path}: records from {seq} on were chained with key id {kid}, which was not "
                                f"given (given: {given}); pass that key too (--key-file, repeatable)")
        return self.keys[kid]

    def after(self, body: dict, seq: int) -> None:
        """A verified ``rotate_key`` record: the records after it use its new key."""
        if body.get("kind") == "admin" and body.get("action") == "rotate_key" and isinstance(body.get("to_key_id"),
                                                                                           str):
            self.key = self._lookup(body["to_key_id"], seq + 1)
            self.current_id = body["to_key_id"]
            self.ids.append(self.current_id)

    def head_problems(self, head: dict | None, last: int) -> list[Problem]:
        """The keyed head: tagged under the newest key, and the log's current key id is that key's."""
        if self.mode == MODE_PLAIN:
            return [Problem(0, "unkeyed", f"{self.path} is an unkeyed (sha256) log but a key was given: a keyed log "
                                          "rewritten without its key looks like this")] if self.keys else []
        found: list[Problem] = []
        if self.meta.get("key_id") != self.current_id:
            found.append(Problem(last, "modified", f"the log's current key id ({self.meta.get('key_id')}) is not the "
                                                   f"one its chain ends with ({self.current_id})"))
        if head is not None and self.key is not None and head.get("tag") != head_tag(self.key, head.get("seq", -1),
                                                                                     head.get("hash", "")):
            found.append(Problem(int(head.get("seq", last)), "modified", "the stored head's tag does not match: the "
                                 "head was moved without the key (were the newest records cut off?)"))
        return found


def _check(path: str, rows, head: dict | None, keyring: _Keyring) -> VerifyReport:
    """The checks, streaming over the rows (only each record's two hashes are kept, not its body)."""
    report = VerifyReport(path, mode=keyring.mode)
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
        intact = chain_hash(prev_hash, body, keyring.key) == stored_hash
        if not intact:
            problems.append(Problem(claimed, "modified", f"record {claimed}'s content does not match its hash"))
        elif (time, kind) != (body.get("time"), body.get("kind")):
            problems.append(Problem(claimed, "modified", f"record {claimed}'s time/kind columns differ from it"))
        expected = chain_hash(expected, body, keyring.key)  # the chain recomputed from the genesis, in stored order
        if intact:
            keyring.after(body, claimed)
    last = max(by_claim, default=0)
    _link_problems(problems, by_claim, head, last, report.records, keyring.mode == MODE_KEYED)
    problems.extend(keyring.head_problems(head, last))
    report.head_seq, report.head_hash, report.key_ids = last, expected, keyring.ids
    if not problems and (by_claim and expected != by_claim[last][1]):  # every break shows above; belt and braces
        problems.append(Problem(last, "modified", "the recomputed chain does not reach the newest record"))
    problems.sort(key=lambda p: (p.seq, p.kind))
    return report


def _link_problems(problems: list[Problem], by_claim: dict[int, tuple[str, str]], head: dict | None, last: int,
                   records: int, keyed: bool = False) -> None:
    """Deleted records (gaps up to the head), rewritten hashes (broken links) and a head that disagrees."""
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
    if head is None and (records or keyed):  # a keyed log has a (tagged) head from its creation on
        problems.append(Problem(0, "modified", "the log's stored head is missing"))
    elif head is not None and head["seq"] == last and last and head["hash"] != by_claim[last][1]:
        problems.append(Problem(last, "modified", f"record {last}'s hash differs from the stored head"))


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
