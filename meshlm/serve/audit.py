"""A hash-chained, sanitized audit log in SQLite (standard library only).

Every record is sanitized *before* it reaches the database: each string, dictionary keys included, at any
depth, and long integers (:func:`sanitize_value`). Records are chained:
``hash_i = SHA-256(hash_{i-1} ‖ canonical JSON of record i)`` with ``hash_0`` sixty-four zeros, the hex strings
concatenated as ASCII; a keyed log (mode ``hmac-sha256``, :mod:`meshlm.serve.audit_keys`) uses HMAC-SHA256 with
a key kept outside the file instead, and tags its head. Record ``i``'s canonical JSON holds every field (``seq``
included) except ``prev_hash`` and ``hash``; see docs/audit.md.

One SQLite transaction per record (``BEGIN IMMEDIATE`` → read head → insert → move head → ``COMMIT``), in WAL
mode with ``synchronous=FULL``: a crash leaves the record whole or absent, never half-written, and several
threads or processes appending to the same file still produce one valid chain.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import sqlite3
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from meshlm.errors import UserError
from meshlm.serve.audit_keys import MODE_KEYED, MODE_PLAIN, head_tag, key_id, record_digest
from meshlm.serve.recognizers_labelled import label_type
from meshlm.serve.sanitize import field_is_label, sanitize, sanitize_field

GENESIS_HASH = "0" * 64
KINDS = ("request", "admin")
# Values under these top-level keys are produced by the server (ids, hashes, version names, codes), not by users;
# they are stored as given. Every other string, at any depth, goes through the sanitizer.
STRUCTURAL_KEYS = frozenset({"kind", "time", "request_id", "version", "user_hash", "status", "action", "name"})
CHAIN_FIELDS = ("prev_hash", "hash")  # stored with a record, outside its hashed body
FORMAT_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_time ON records(time);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def canonical_json(body: dict) -> bytes:
    """The bytes that are hashed: sorted keys, no spaces, UTF-8, no NaN/Infinity (they have no JSON form)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def chain_hash(prev_hash: str, body: dict, key: bytes | None = None) -> str:
    return record_digest(prev_hash, canonical_json(body), key)


def normalize_time(value: Any) -> str:
    """An ISO-8601 UTC timestamp with microseconds and ``Z`` (sorts as text), from ISO text, epoch seconds or a
    datetime (naive means UTC)."""
    if isinstance(value, bool):
        raise ValueError(f"audit time must be ISO-8601 text or epoch seconds, not {value!r}")
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    elif isinstance(value, (int, float)):
        moment = datetime.fromtimestamp(value, tz=timezone.utc)
    elif isinstance(value, str):
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        if moment.tzinfo is None:  # a naive time is taken as UTC
            moment = moment.replace(tzinfo=timezone.utc)
    else:
        raise ValueError(f"audit time must be ISO-8601 text or epoch seconds, not {type(value).__name__}")
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


MAX_DEPTH = 48  # deeper JSON is stored as the sanitized text of its keys and scalars (one string)


def sanitize_value(value: Any, field: str | None = None, depth: int = 0) -> Any:
    """Sanitize everything a client can put in ``value``: strings, dictionary keys, and integers long enough to
    be an identifier (a card or SSN sent as a JSON number). ``field`` is the key the value sits under (a list
    passes its key to its items): a key that names an identifier ("ssn", "cardNumber") labels the value."""
    if isinstance(value, str):
        return sanitize_field(field, value)
    if isinstance(value, (dict, list, tuple)) and depth >= MAX_DEPTH:
        return sanitize(" ".join(_flatten(value)))  # no recursion limit, and json.dumps could not store it
    if isinstance(value, dict):
        clean: dict[str, Any] = {}
        named = _sibling_label(value)
        for key, item in value.items():
            key = str(key)
            context = key if named is None or field_is_label(key) else named
            clean[_free_name(_sanitize_key(key), clean)] = sanitize_value(item, context, depth + 1)
        return clean
    if isinstance(value, (list, tuple)):
        return [sanitize_value(v, field, depth + 1) for v in value]
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) or isinstance(value, float) and value.is_integer():
        return _sanitize_number(value, field)
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)  # NaN/Infinity: not JSON, kept as text
    raise TypeError(f"audit record values must be JSON types (str, number, bool, null, list, dict), "
                    f"got {type(value).__name__}")


def _sibling_label(value: dict) -> str | None:
    """A short string value that names an identifier labels its siblings: {"field": "SSN", "value": "…"},
    {"name": "update_ssn", "arguments": "{\\"old\\": \\"…\\"}"}."""
    for item in value.values():
        if isinstance(item, str) and len(item) <= 40 and label_type(item) is not None:
            return item
    return None


def _flatten(value: Any) -> list[str]:
    """Every key and scalar inside ``value`` as text, depth-first, without recursion."""
    out: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, sub in reversed(list(item.items())):
                stack.append(sub)
                stack.append(f"{key}:")
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        elif item is not None:
            out.append(str(item))
    return out


def _sanitize_number(value: int | float, field: str | None) -> int | float | str:
    """A number stays a number unless the sanitizer finds an identifier in its digits (then its placeholder).
    Under a field that names an identifier from 5 digits on ({"ssn": 123456789}, {"zip": ...} stays); elsewhere
    from 9 (a card sent as a number), so token-id prompts and counts cost nothing."""
    digits = str(abs(int(value)))
    if len(digits) < (5 if field_is_label(field) else 9):
        return value
    clean = sanitize_field(field, digits)
    return value if clean == digits else clean


_NAME_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")


def _sanitize_key(key: str) -> str:
    """Keys repeat ("role", "content", "tool_calls"): the sanitized form of a name-shaped key is cached; any other
    key (an address, a number) is sanitized each time and never kept in memory."""
    return _sanitize_name_key(key) if _NAME_KEY.fullmatch(key) else sanitize(key)


@functools.lru_cache(maxsize=4096)
def _sanitize_name_key(key: str) -> str:
    return sanitize(key)


def _free_name(key: str, taken: dict) -> str:
    """Two keys may sanitize to the same text ("<EMAIL>"): number the later ones instead of dropping values."""
    if key not in taken:
        return key
    n = 2
    while f"{key}#{n}" in taken:
        n += 1
    return f"{key}#{n}"


def sanitize_record(record: dict) -> dict:
    """The record as it will be stored: structural top-level keys kept, everything else sanitized."""
    if not isinstance(record, dict):
        raise TypeError(f"an audit record is a dict, got {type(record).__name__}")
    if record.get("kind") not in KINDS:
        raise ValueError(f"audit record kind must be one of {KINDS}, got {record.get('kind')!r}")
    clean: dict[str, Any] = {}
    for key, value in record.items():
        key = str(key)
        if key in ("seq", *CHAIN_FIELDS):
            raise ValueError(f"audit record field {key!r} is assigned by the log; leave it out")
        if key in STRUCTURAL_KEYS and (value is None or isinstance(value, (str, int, float, bool))):
            clean[key] = value
        else:
            clean[_free_name(_sanitize_key(key), clean)] = sanitize_value(value, key)
    clean["time"] = normalize_time(record["time"]) if record.get("time") is not None else _now()
    return clean


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AuditLogError(UserError):
    """A missing, unreadable or foreign audit database."""


def connect(path: str | Path, *, create: bool) -> sqlite3.Connection:
    """A connection in autocommit mode (we open our own transactions), WAL, full fsync on commit. ``create``
    makes the tables in a new or empty file, owner-only (0600); a database that holds other tables (the
    registry given by mistake) or is not SQLite at all is refused, untouched."""
    path = Path(path)
    new = not path.exists() or path.stat().st_size == 0
    try:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30.0)
        conn.execute("PRAGMA busy_timeout = 30000")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and not {"records", "meta"} <= tables:
            conn.close()
            raise AuditLogError(f"{path} is an SQLite database but not a meshlm audit log (tables: "
                                f"{', '.join(sorted(tables))}); give --audit a new file")
        if create:
            if new:
                os.chmod(path, 0o600)  # sanitized, but still prompts and user hashes: not for other accounts
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(_SCHEMA)
            conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('format', ?)", (str(FORMAT_VERSION),))
        conn.execute("PRAGMA synchronous = FULL")
    except sqlite3.OperationalError as exc:
        raise AuditLogError(f"cannot open the audit database {path} ({exc}); check that its folder exists and "
                            "is writable") from None
    except sqlite3.DatabaseError as exc:
        raise AuditLogError(f"{path} is not a meshlm audit database ({exc})") from None
    return conn


def read_meta(conn: sqlite3.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT key, value FROM meta").fetchall())


def chain_mode(meta: dict[str, str]) -> str:
    """A log written before keyed chains existed has no ``mode``: it is unkeyed."""
    return meta.get("mode", MODE_PLAIN)


class AuditLog:
    """Append-only, sanitized, hash-chained records; safe to share between threads (and processes).

    ``AuditLog(path)`` creates the file or opens an existing one and continues its chain. ``key`` (bytes, from
    :mod:`meshlm.serve.audit_keys`) makes a new log keyed (HMAC-SHA256) and must be given to continue a keyed one;
    an unkeyed log is keyed later only by :meth:`rotate_key`, which the chain records.
    """

    def __init__(self, path: str | Path, key: bytes | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._key = key
        self._conn: sqlite3.Connection | None = connect(self.path, create=True)
        try:
            self.mode = self._settle_mode()
        except BaseException:
            self._conn.close()
            raise

    def _settle_mode(self) -> str:
        """Record a new log's mode (keyed when a key is given); check the key against an existing log's."""
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            meta = read_meta(conn)
            if "mode" not in meta:
                used = "head" in meta or conn.execute("SELECT 1 FROM records LIMIT 1").fetchone() is not None
                mode = MODE_KEYED if self._key is not None and not used else MODE_PLAIN
                rows = [("mode", mode)] + ([("key_id", key_id(self._key)), ("first_key_id", key_id(self._key))]
                                           if mode == MODE_KEYED else [])
                if mode == MODE_KEYED:  # a tagged genesis head: wiping every record and the head needs the key too
                    genesis = {"seq": 0, "hash": GENESIS_HASH, "tag": head_tag(self._key, 0, GENESIS_HASH)}
                    rows.append(("head", json.dumps(genesis)))
                conn.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", rows)
                meta.update(rows)
            self._check_key(meta)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return chain_mode(meta)

    def _check_key(self, meta: dict[str, str]) -> None:
        mode = chain_mode(meta)
        if mode not in (MODE_PLAIN, MODE_KEYED):
            raise AuditLogError(f"{self.path}: unknown chain mode {mode!r} (this meshlm knows sha256 and "
                                "hmac-sha256); upgrade meshlm")
        if mode == MODE_PLAIN and self._key is not None:
            raise AuditLogError(f"{self.path} is an unkeyed (sha256) audit log; serve it without a key, or key it "
                                f"with `meshlm audit rotate-key {self.path} --new-key-file FILE` (recorded in its "
                                "chain)")
        if mode == MODE_KEYED and self._key is None:
            raise AuditLogError(f"{self.path} is a keyed (hmac-sha256) audit log, key id {meta.get('key_id')}; give "
                                "its key (--audit-key-file FILE or $MESHLM_AUDIT_KEY_FILE / $MESHLM_AUDIT_KEY)")
        if mode == MODE_KEYED and key_id(self._key) != meta.get("key_id"):
            raise AuditLogError(f"{self.path}: the audit key given (id {key_id(self._key)}) is not this log's "
                                f"current key (id {meta.get('key_id')}); was it rotated? give the newest key")

    def append(self, record: dict) -> dict:
        """Sanitize ``record``, chain it and commit it in one transaction; return the stored record
        (with ``seq``, ``prev_hash`` and ``hash``)."""
        body = sanitize_record(record)  # before the lock: sanitizing is the slow part and needs no order
        return self._commit(body)

    def rotate_key(self, new_key: bytes) -> dict:
        """Append a ``rotate_key`` record chained under the current key (or unkeyed), then chain every later
        record, and tag the head, with ``new_key``. Other writers holding the old key stop with a clear error."""
        if self._key is not None and key_id(new_key) == key_id(self._key):
            raise AuditLogError(f"{self.path}: the new audit key is the current one (id {key_id(new_key)}); "
                                "make a new one with `meshlm audit keygen FILE`")
        body = {"kind": "admin", "action": "rotate_key", "time": _now(), "status": 200, "from_mode": self.mode,
                "from_key_id": key_id(self._key) if self._key is not None else None, "to_key_id": key_id(new_key)}
        stored = self._commit(body, new_key=new_key)
        self._key, self.mode = new_key, MODE_KEYED
        return stored

    def _commit(self, body: dict, new_key: bytes | None = None) -> dict:
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")  # the write lock: no other writer can move the head under us
            try:
                self._check_key(read_meta(conn))  # another process may have rotated the key since we opened
                row = conn.execute("SELECT seq, hash FROM records ORDER BY seq DESC LIMIT 1").fetchone()
                seq, prev_hash = (row[0] + 1, row[1]) if row else (1, GENESIS_HASH)
                body["seq"] = seq
                digest = chain_hash(prev_hash, body, self._key)
                conn.execute("INSERT INTO records(seq, time, kind, body, prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?)",
                             (seq, body["time"], body["kind"], canonical_json(body).decode(), prev_hash, digest))
                # The head is kept apart from the rows so that deleting the newest records is detected too; a keyed
                # log tags it, so that moving it back (after cutting the newest records) needs the key.
                head_key = new_key if new_key is not None else self._key
                head = {"seq": seq, "hash": digest}
                if head_key is not None:
                    head["tag"] = head_tag(head_key, seq, digest)
                updates = [("head", json.dumps(head))]
                if new_key is not None:
                    updates += [("mode", MODE_KEYED), ("key_id", key_id(new_key))]
                conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", updates)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return {**body, "prev_hash": prev_hash, "hash": digest}

    def head(self) -> dict:
        """``{"seq", "hash"}`` of the newest record (seq 0 and the genesis hash when empty)."""
        with self._lock:
            row = self._connection().execute("SELECT value FROM meta WHERE key = 'head'").fetchone()
        head = json.loads(row[0]) if row else {}
        return {"seq": head.get("seq", 0), "hash": head.get("hash", GENESIS_HASH)}

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # fold the WAL into the main file
                self._conn.close()
                self._conn = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"audit log {self.path} is closed")
        return self._conn

    def __enter__(self) -> "AuditLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
