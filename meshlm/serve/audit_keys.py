"""The audit chain's key: where it is read from, its id, and the two keyed digests (record and head).

A keyed log (mode ``hmac-sha256``) chains ``hash_i = HMAC-SHA256(key, ascii(hash_{i-1}) ‖ canonical JSON of
record i)`` and stores beside its head a tag ``HMAC-SHA256(key, "meshlm-audit-head:" ‖ seq ‖ ":" ‖ hash)``, so
that rewriting a record, or cutting the newest records and moving the head back, needs the key. The key lives
outside the database (a file or ``MESHLM_AUDIT_KEY``); the database holds only its id, a SHA-256 of the key under
a label of its own, never the key. docs/audit.md.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Mapping

from meshlm.errors import ConfigError

MODE_PLAIN = "sha256"
MODE_KEYED = "hmac-sha256"
MIN_KEY_BYTES = 32
KEY_ENV = "MESHLM_AUDIT_KEY"
KEY_FILE_ENV = "MESHLM_AUDIT_KEY_FILE"
_HOW = "make one with `meshlm audit keygen FILE` (or `openssl rand -hex 32 > FILE`)"


def key_id(key: bytes) -> str:
    """A short public name for ``key``: 16 hex digits of SHA-256 over a label and the key (not the key)."""
    return hashlib.sha256(b"meshlm-audit-key-id:" + key).hexdigest()[:16]


def record_digest(prev_hash: str, body_bytes: bytes, key: bytes | None) -> str:
    """The chain step: SHA-256 without a key, HMAC-SHA256 with one; same message either way."""
    message = prev_hash.encode("ascii") + body_bytes
    if key is None:
        return hashlib.sha256(message).hexdigest()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def head_tag(key: bytes, seq: int, digest: str) -> str:
    """The keyed statement "the log ends at record ``seq`` with ``digest``" (a record's message starts with hex
    digits, this one with a letter: the two can never be confused)."""
    return hmac.new(key, f"meshlm-audit-head:{seq}:{digest}".encode("ascii"), hashlib.sha256).hexdigest()


def parse_key(text: str, where: str) -> bytes:
    key = text.strip()
    if len(key.encode()) < MIN_KEY_BYTES:
        raise ConfigError(f"{where}: an audit key needs at least {MIN_KEY_BYTES} characters, got {len(key)}; "
                          f"{_HOW}")
    return key.encode()


def read_key_file(path: str | Path, flag: str = "--key-file") -> bytes:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{flag} {path}: cannot read the audit key ({reason}); {_HOW}") from None
    return parse_key(text, f"{flag} {path}")


def key_from_env(env: Mapping[str, str] | None = None) -> bytes | None:
    """``MESHLM_AUDIT_KEY_FILE`` (a path) or ``MESHLM_AUDIT_KEY`` (the key itself); None when neither is set."""
    env = os.environ if env is None else env
    if env.get(KEY_FILE_ENV):
        return read_key_file(env[KEY_FILE_ENV], f"${KEY_FILE_ENV}")
    if env.get(KEY_ENV):
        return parse_key(env[KEY_ENV], f"${KEY_ENV}")
    return None


def write_new_key(path: str | Path) -> bytes:
    """A fresh random key (64 hex digits) in a new owner-only file; an existing file is never overwritten."""
    path = Path(path)
    key = secrets.token_hex(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} exists; audit keys are never overwritten (pick a new file name)") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot create the key file ({exc.strerror})") from None
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(key + "\n")
        f.flush()
        os.fsync(f.fileno())
    return key.encode()
