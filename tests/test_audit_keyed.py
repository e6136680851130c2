"""The keyed audit chain (HMAC-SHA256, key outside the database): whoever can write the file but lacks the key
can no longer cut the newest records and move the head back, rebuild the chain, or pass a rebuilt log off as an
unkeyed one; rotation is a chain record; logs written the old (unkeyed) way still verify and continue."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from meshlm.cli.main import main as meshlm_main
from meshlm.serve.audit import GENESIS_HASH, AuditLog, canonical_json
from meshlm.serve.audit_keys import key_id, write_new_key
from meshlm.serve.audit_verify import AuditLogError, verify

KEY = b"k" * 16 + b"0123456789abcdef0123"
NEW_KEY = b"n" * 40


def fill(path: Path, n: int, key: bytes | None = KEY) -> Path:
    with AuditLog(path, key=key) as log:
        for i in range(n):
            log.append({"kind": "request", "request_id": f"req-{i}", "prompt": f"question {i}", "status": 200})
    return path


def sql(path: Path, statement: str, *args) -> None:
    conn = sqlite3.connect(str(path))
    conn.execute(statement, args)
    conn.commit()
    conn.close()


def meta(path: Path) -> dict:
    conn = sqlite3.connect(str(path))
    try:
        return dict(conn.execute("SELECT key, value FROM meta").fetchall())
    finally:
        conn.close()


def rebuild_unkeyed(path: Path, keep: int) -> None:
    """What someone with write access but no key can do: keep the first records, recompute every hash with
    SHA-256, and write a consistent head (the attack that passed `audit verify` on any log before keying)."""
    conn = sqlite3.connect(str(path))
    conn.execute("DELETE FROM records WHERE seq > ?", (keep,))
    prev = GENESIS_HASH
    for seq, body in conn.execute("SELECT seq, body FROM records ORDER BY seq").fetchall():
        digest = hashlib.sha256(prev.encode() + canonical_json(json.loads(body))).hexdigest()
        conn.execute("UPDATE records SET prev_hash = ?, hash = ? WHERE seq = ?", (prev, digest, seq))
        prev = digest
    conn.execute("UPDATE meta SET value = ? WHERE key = 'head'", (json.dumps({"seq": keep, "hash": prev}),))
    conn.execute("UPDATE meta SET value = 'sha256' WHERE key = 'mode'")
    conn.commit()
    conn.close()


def test_a_keyed_log_verifies_with_its_key_and_says_so(tmp_path):
    path = fill(tmp_path / "a.db", 5)
    assert meta(path)["mode"] == "hmac-sha256" and meta(path)["key_id"] == key_id(KEY)
    assert KEY.decode() not in path.read_bytes().decode("latin-1")  # the id is stored, never the key
    report = verify(path, [KEY])
    assert report.ok and report.records == 5 and report.mode == "hmac-sha256" and report.key_ids == [key_id(KEY)]
    with pytest.raises(AuditLogError, match="keyed .*give its key"):
        verify(path)
    with pytest.raises(AuditLogError, match=f"key id {key_id(KEY)}.*not given"):
        verify(path, [NEW_KEY])


def test_cutting_the_tail_and_moving_the_head_needs_the_key(tmp_path):
    """The issue's attack: delete the newest records and point meta.head at the new last record."""
    for keyed in (False, True):
        path = fill(tmp_path / f"{keyed}.db", 6, KEY if keyed else None)
        conn = sqlite3.connect(str(path))
        last_hash = conn.execute("SELECT hash FROM records WHERE seq = 4").fetchone()[0]
        conn.execute("DELETE FROM records WHERE seq > 4")
        head = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'head'").fetchone()[0])
        head.update(seq=4, hash=last_hash)  # the old tag stays (or is dropped: both are caught below)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'head'", (json.dumps(head),))
        conn.commit()
        conn.close()
        report = verify(path, [KEY] if keyed else [])
        if keyed:
            assert not report.ok and [(p.seq, p.kind) for p in report.problems] == [(4, "modified")]
            assert "moved without the key" in report.problems[0].detail
            head.pop("tag")
            sql(path, "UPDATE meta SET value = ? WHERE key = 'head'", json.dumps(head))
            assert not verify(path, [KEY]).ok
        else:
            assert report.ok  # the limit of an unkeyed log, as docs/audit.md says


def test_wiping_a_keyed_log_needs_the_key(tmp_path):
    """Every record and meta.head deleted: a keyed log always has a tagged head (seq 0 when new), so this is
    modified; an empty keyed log verifies, and a genesis head moved without the key does not."""
    empty = tmp_path / "empty.db"
    AuditLog(empty, key=KEY).close()
    assert verify(empty, [KEY]).ok
    path = fill(tmp_path / "wiped.db", 3)
    sql(path, "DELETE FROM records")
    sql(path, "DELETE FROM meta WHERE key = 'head'")
    report = verify(path, [KEY])
    assert not report.ok and [(p.seq, p.kind) for p in report.problems] == [(0, "modified")]
    sql(path, "INSERT INTO meta(key, value) VALUES ('head', ?)", json.dumps({"seq": 0, "hash": GENESIS_HASH}))
    assert not verify(path, [KEY]).ok  # an untagged genesis head
    assert verify(fill(tmp_path / "plain.db", 0, None)).ok  # an empty unkeyed log, as before


def test_a_chain_rebuilt_without_the_key_is_caught(tmp_path):
    path = fill(tmp_path / "a.db", 6)
    rebuild_unkeyed(path, keep=3)  # a consistent sha256 log now: it passes when verified without a key...
    assert verify(path).ok
    report = verify(path, [KEY])  # ...but a key was expected: the operator verifies with the key
    assert not report.ok and {p.kind for p in report.problems} == {"unkeyed"}
    path = fill(tmp_path / "b.db", 6)
    rebuild_unkeyed(path, keep=6)
    sql(path, "UPDATE meta SET value = 'hmac-sha256' WHERE key = 'mode'")  # claims to be keyed: hashes fail
    assert {p.kind for p in verify(path, [KEY]).problems} == {"modified"}


def test_opening_needs_the_right_key(tmp_path):
    path = fill(tmp_path / "a.db", 2)
    with pytest.raises(AuditLogError, match="keyed .*give its key"):
        AuditLog(path)
    with pytest.raises(AuditLogError, match="not this log's current key"):
        AuditLog(path, key=NEW_KEY)
    plain = fill(tmp_path / "p.db", 2, key=None)
    with pytest.raises(AuditLogError, match="unkeyed .*rotate-key"):
        AuditLog(plain, key=KEY)


def test_rotation_is_a_chain_record_and_old_keys_stay_needed(tmp_path):
    path = fill(tmp_path / "a.db", 3)
    writer = AuditLog(path, key=KEY)  # a second writer still holding the old key
    with AuditLog(path, key=KEY) as log:
        rotation = log.rotate_key(NEW_KEY)
        log.append({"kind": "request", "request_id": "after", "prompt": "p"})
    assert rotation["seq"] == 4 and (rotation["from_key_id"], rotation["to_key_id"]) == (key_id(KEY), key_id(NEW_KEY))
    with pytest.raises(AuditLogError, match="rotated"):
        writer.append({"kind": "request", "prompt": "late"})
    writer.close()
    report = verify(path, [KEY, NEW_KEY])
    assert report.ok and report.records == 5 and report.key_ids == [key_id(KEY), key_id(NEW_KEY)]
    with pytest.raises(AuditLogError, match=f"records from 1 on .*{key_id(KEY)}"):
        verify(path, [NEW_KEY])
    with pytest.raises(AuditLogError, match=f"records from 5 on .*{key_id(NEW_KEY)}"):
        verify(path, [KEY])
    # The rotation record is chained under the old key: pointing it at a key of one's own is caught.
    sql(path, "UPDATE records SET body = replace(body, ?, ?) WHERE seq = 4", key_id(NEW_KEY), key_id(b"x" * 40))
    assert (4, "modified") in {(p.seq, p.kind) for p in verify(path, [KEY, NEW_KEY, b"x" * 40]).problems}


def test_a_rotation_record_rewritten_is_modified(tmp_path):
    path = fill(tmp_path / "a.db", 2)
    with AuditLog(path, key=KEY) as log:
        log.rotate_key(NEW_KEY)
    sql(path, "UPDATE records SET body = replace(body, '\"status\":200', '\"status\":201') WHERE seq = 3")
    assert (3, "modified") in {(p.seq, p.kind) for p in verify(path, [KEY, NEW_KEY]).problems}


def old_style_log(path: Path, n: int) -> Path:
    """An audit log exactly as meshlm wrote it before keyed chains: no `mode` in meta, SHA-256 chain."""
    conn = sqlite3.connect(str(path))
    conn.executescript("CREATE TABLE records (seq INTEGER PRIMARY KEY, time TEXT NOT NULL, kind TEXT NOT NULL, "
                       "body TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL);"
                       "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                       "INSERT INTO meta VALUES ('format', '1');")
    prev = GENESIS_HASH
    for seq in range(1, n + 1):
        body = {"kind": "request", "time": f"2026-11-30T21:00:0{seq}.000000Z", "prompt": "<EMAIL>", "seq": seq}
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        digest = hashlib.sha256(prev.encode() + text.encode()).hexdigest()
        conn.execute("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?)",
                     (seq, body["time"], "request", text, prev, digest))
        prev = digest
    conn.execute("INSERT INTO meta VALUES ('head', ?)", (json.dumps({"seq": n, "hash": prev}),))
    conn.commit()
    conn.close()
    return path


def test_old_unkeyed_logs_still_verify_continue_and_can_be_keyed(tmp_path):
    path = old_style_log(tmp_path / "old.db", 3)
    report = verify(path)
    assert report.ok and report.mode == "sha256" and report.key_ids == [None]
    with AuditLog(path) as log:
        assert log.mode == "sha256" and log.append({"kind": "admin", "action": "restart"})["seq"] == 4
        log.rotate_key(KEY)  # keying an unkeyed log: the rotation record is the last unkeyed one
        log.append({"kind": "request", "prompt": "keyed now"})
    report = verify(path, [KEY])
    assert report.ok and report.mode == "hmac-sha256" and report.key_ids == [None, key_id(KEY)]
    rebuild_unkeyed(path, keep=4)  # cut the keyed part off and call it unkeyed: caught with the key
    assert not verify(path, [KEY]).ok


def run_cli(capfd, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        meshlm_main(list(argv))
    out, err = capfd.readouterr()
    return exit_info.value.code, out, err


def test_cli_keygen_verify_and_rotate(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("MESHLM_AUDIT_KEY", raising=False)
    monkeypatch.delenv("MESHLM_AUDIT_KEY_FILE", raising=False)
    old_file, new_file = tmp_path / "old.key", tmp_path / "new.key"
    code, out, _ = run_cli(capfd, "audit", "keygen", str(old_file), "--json")
    old = old_file.read_text().strip().encode()
    assert code == 0 and json.loads(out)["key_id"] == key_id(old) and old_file.stat().st_mode & 0o077 == 0
    code, _, err = run_cli(capfd, "audit", "keygen", str(old_file))
    assert code == 2 and "never overwritten" in err
    db = fill(tmp_path / "a.db", 3, key=old)

    code, _, err = run_cli(capfd, "audit", "verify", str(db))
    assert code == 2 and "keyed" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    code, out, _ = run_cli(capfd, "audit", "verify", str(db), "--key-file", str(old_file))
    assert code == 0 and "hmac-sha256" in out and key_id(old) in out
    monkeypatch.setenv("MESHLM_AUDIT_KEY_FILE", str(old_file))
    code, out, _ = run_cli(capfd, "audit", "verify", str(db), "--json")
    assert code == 0 and json.loads(out)["mode"] == "hmac-sha256"

    write_new_key(new_file)
    code, out, _ = run_cli(capfd, "audit", "rotate-key", str(db), "--new-key-file", str(new_file))
    assert code == 0 and "record 4 rotates" in out
    monkeypatch.delenv("MESHLM_AUDIT_KEY_FILE")
    code, _, err = run_cli(capfd, "audit", "verify", str(db), "--key-file", str(new_file))
    assert code == 2 and key_id(old) in err
    code, out, _ = run_cli(capfd, "audit", "verify", str(db), "--key-file", str(old_file), "--key-file",
                           str(new_file), "--json")
    assert code == 0 and json.loads(out)["key_ids"] == [key_id(old), key_id(new_file.read_text().strip().encode())]
    (tmp_path / "short.key").write_text("tooshort\n")
    code, _, err = run_cli(capfd, "audit", "verify", str(db), "--key-file", str(tmp_path / "short.key"))
    assert code == 2 and "at least 32" in err
    code, _, err = run_cli(capfd, "audit", "rotate-key", str(tmp_path / "missing.db"), "--new-key-file",
                           str(new_file))
    assert code == 2 and "does not exist" in err and not (tmp_path / "missing.db").exists()


def test_serve_reads_the_audit_key_before_anything_else(tmp_path, capfd, monkeypatch):
    """`meshlm serve --audit-key-file` (or $MESHLM_AUDIT_KEY) is checked before the registry is opened."""
    monkeypatch.delenv("MESHLM_AUDIT_KEY_FILE", raising=False)
    (tmp_path / "short.key").write_text("short\n")
    code, _, err = run_cli(capfd, "serve", "--registry", str(tmp_path / "none.sqlite"), "--model", "x:v1",
                           "--audit-key-file", str(tmp_path / "short.key"))
    assert code == 2 and "--audit-key-file" in err and "at least 32" in err and "Traceback" not in err
    monkeypatch.setenv("MESHLM_AUDIT_KEY", "too short")
    code, _, err = run_cli(capfd, "serve", "--registry", str(tmp_path / "none.sqlite"), "--model", "x:v1")
    assert code == 2 and "$MESHLM_AUDIT_KEY" in err and not (tmp_path / "none.sqlite").exists()
