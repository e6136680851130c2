"""A hash-chained, sanitized audit log in SQLite (standard library only).

Every record is sanitized (:func:`meshlm.serve.sanitize.sanitize` on each string value, recursively) *before*
it reaches the database. Records are chained: ``hash_i = SHA-256(hash_{i-1} ‖ canonical JSON of record i)``
with ``hash_0`` sixty-four zeros, the hex strings concatenated as ASCII. Record ``i``'s canonical JSON holds
every field (``seq`` included) except ``prev_hash`` and ``hash``; see docs/audit.md.

One SQLite transaction per record (``BEGIN IMMEDIATE`` → read head → insert → move head → ``COMMIT``), in WAL
mode with ``synchronous=FULL``: a crash leaves the record whole or absent, never half-written, and several
threads or processes appending to the same file still produce one valid chain.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from meshlm.errors import UserError
from meshlm.serve.sanitize import sanitize

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


def chain_hash(prev_hash: str, body: dict) -> str:
    return hashlib.sha256(prev_hash.encode("ascii") + canonical_json(body)).hexdigest()


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


def sanitize_value(value: Any) -> Any:
    """Sanitize every string inside ``value`` (dict values, list items); other JSON scalars pass unchanged."""
    if isinstance(value, str):
        return sanitize(value)
    if isinstance(value, dict):
        return {str(k): sanitize_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize_value(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise TypeError(f"audit record values must be JSON types (str, number, bool, null, list, dict), "
                    f"got {type(value).__name__}")


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
            clean[key] = sanitize_value(value)
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


class AuditLog:
    """Append-only, sanitized, hash-chained records; safe to share between threads (and processes).

    ``AuditLog(path)`` creates the file or opens an existing one and continues its chain.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = connect(self.path, create=True)

    def append(self, record: dict) -> dict:
        """Sanitize ``record``, chain it and commit it in one transaction; return the stored record
        (with ``seq``, ``prev_hash`` and ``hash``)."""
        body = sanitize_record(record)  # before the lock: sanitizing is the slow part and needs no order
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")  # the write lock: no other writer can move the head under us
            try:
                row = conn.execute("SELECT seq, hash FROM records ORDER BY seq DESC LIMIT 1").fetchone()
                seq, prev_hash = (row[0] + 1, row[1]) if row else (1, GENESIS_HASH)
                body["seq"] = seq
                digest = chain_hash(prev_hash, body)
                conn.execute("INSERT INTO records(seq, time, kind, body, prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?)",
                             (seq, body["time"], body["kind"], canonical_json(body).decode(), prev_hash, digest))
                # The head is kept apart from the rows so that deleting the newest records is detected too.
                conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('head', ?)",
                             (json.dumps({"seq": seq, "hash": digest}),))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return {**body, "prev_hash": prev_hash, "hash": digest}

    def head(self) -> dict:
        """``{"seq", "hash"}`` of the newest record (seq 0 and the genesis hash when empty)."""
        with self._lock:
            row = self._connection().execute("SELECT value FROM meta WHERE key = 'head'").fetchone()
        return json.loads(row[0]) if row else {"seq": 0, "hash": GENESIS_HASH}

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
