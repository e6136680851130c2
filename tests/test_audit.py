"""The hash-chained audit log: sanitized before disk, tamper-evident, continues across restarts, safe under
concurrent and crashing writers; ``meshlm audit verify|export`` exit codes and JSON."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from meshlm.cli.main import main as meshlm_main
from meshlm.serve.audit import GENESIS_HASH, AuditLog, chain_hash
from meshlm.serve.audit_verify import AuditLogError, export, verify

ROOT = Path(__file__).resolve().parents[1]
RAW = {  # raw personal data that must never reach the database file
    "email": "maria.gonzalez@example.com", "phone": "+44 20 7946 0958", "card": "4111 1111 1111 1111",
    "iban": "DE89 3704 0044 0532 0130 00", "ssn": "536-22-8714", "key": "sk-proj-Zq8mP2xRk5YczUJ4zIKdztgacm06",
    "name": "Olivia Bennett", "ip": "203.0.113.45",
}


def request_record(i: int) -> dict:
    prompt = (f"Hi, my name is {RAW['name']}, mail {RAW['email']}, call {RAW['phone']}, card {RAW['card']}, "
              f"IBAN {RAW['iban']}, SSN {RAW['ssn']}, key {RAW['key']}, from {RAW['ip']} (request {i})")
    return {"kind": "request", "request_id": f"req-{i}", "version": "tiny:v1", "user_hash": "ab12cd",
            "status": 200, "messages": [{"role": "user", "content": prompt}], "response": "Sure.",
            "prompt_tokens": 40, "completion_tokens": 2, "latency_ms": 12.5}


def filled(path: Path, n: int) -> Path:
    with AuditLog(path) as log:
        for i in range(n):
            log.append(request_record(i) if i % 3 else {"kind": "admin", "action": "rollout", "name": "tiny",
                                                        "version": "tiny:v2", "share": 0.1})
    return path


def tamper(path: Path, sql: str, *args) -> None:
    conn = sqlite3.connect(str(path))
    conn.execute(sql, args)
    conn.commit()
    conn.close()


def problems(path: Path) -> set[tuple[int, str]]:
    return {(p.seq, p.kind) for p in verify(path).problems}


def test_append_sanitizes_and_chains(tmp_path):
    with AuditLog(tmp_path / "a.db") as log:
        first = log.append(request_record(0))
        second = log.append({"kind": "admin", "action": "promote", "name": "tiny", "version": "tiny:v2",
                             "detail": {"by": "ops", "note": f"asked by {RAW['email']}"}})
    assert (first["seq"], second["seq"]) == (1, 2)
    assert first["prev_hash"] == GENESIS_HASH and second["prev_hash"] == first["hash"]
    body = {k: v for k, v in second.items() if k not in ("prev_hash", "hash")}
    assert second["hash"] == chain_hash(first["hash"], body)
    content = first["messages"][0]["content"]
    for value in RAW.values():
        assert value not in content
    for placeholder in ("<PERSON>", "<EMAIL>", "<PHONE>", "<CREDIT_CARD>", "<IBAN>", "<US_SSN>", "<API_KEY>",
                        "<IP_ADDRESS>"):
        assert placeholder in content
    # Structural keys are stored as given (even a name-like model name); nested strings are sanitized.
    assert (second["name"], second["version"], second["action"]) == ("tiny", "tiny:v2", "promote")
    assert second["detail"] == {"by": "ops", "note": "asked by <EMAIL>"}
    assert export(tmp_path / "a.db") == [first, second]


def test_bad_records_are_refused_before_anything_is_written(tmp_path):
    with AuditLog(tmp_path / "a.db") as log:
        with pytest.raises(ValueError, match="kind"):
            log.append({"kind": "chat", "prompt": "x"})
        with pytest.raises(ValueError, match="seq"):
            log.append({"kind": "request", "seq": 7})
        with pytest.raises(TypeError, match="JSON types"):
            log.append({"kind": "request", "payload": b"bytes"})
        assert log.head()["seq"] == 0


def test_foreign_or_broken_files_are_refused_untouched(tmp_path):
    other = tmp_path / "registry.sqlite"
    conn = sqlite3.connect(str(other))
    conn.execute("CREATE TABLE versions (name TEXT)")
    conn.commit()
    conn.close()
    before = other.read_bytes()
    with pytest.raises(AuditLogError, match="not a meshlm audit log"):
        AuditLog(other)
    assert other.read_bytes() == before
    junk = tmp_path / "junk.db"
    junk.write_text("not a database " * 200)
    with pytest.raises(AuditLogError, match="not a meshlm audit database"):
        AuditLog(junk)
    fresh = tmp_path / "fresh.db"
    AuditLog(fresh).close()
    assert fresh.stat().st_mode & 0o077 == 0  # owner-only


def test_database_file_holds_no_raw_pii(tmp_path):
    path = tmp_path / "a.db"
    log = AuditLog(path)
    for i in range(20):
        log.append(request_record(i))
    # While open (WAL not yet folded in) and after closing, no file of the database holds raw values.
    for stage in ("open", "closed"):
        blob = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("a.db"))
        assert b"<EMAIL>" in blob, stage
        for value in RAW.values():
            assert value.encode() not in blob, (stage, value)
        log.close()


def test_restart_continues_the_chain(tmp_path):
    path = filled(tmp_path / "a.db", 5)
    head = AuditLog(path).head()
    with AuditLog(path) as log:
        record = log.append(request_record(99))
    assert record["seq"] == 6 and record["prev_hash"] == head["hash"]
    report = verify(path)
    assert report.ok and report.records == 6 and report.head_hash == record["hash"]


def test_verify_detects_a_modified_record(tmp_path):
    path = filled(tmp_path / "a.db", 6)
    assert verify(path).ok
    tamper(path, "UPDATE records SET body = replace(body, 'tiny:v1', 'tiny:v9') WHERE seq = 3")
    assert problems(path) == {(3, "modified")}


def test_verify_detects_a_modified_record_whose_hash_was_recomputed(tmp_path):
    path = filled(tmp_path / "a.db", 6)
    conn = sqlite3.connect(str(path))
    body, prev = conn.execute("SELECT body, prev_hash FROM records WHERE seq = 4").fetchone()
    forged = json.loads(body) | {"status": 500}
    conn.execute("UPDATE records SET body = ?, hash = ? WHERE seq = 4",
                 (json.dumps(forged), chain_hash(prev, forged)))
    conn.commit()
    conn.close()
    assert problems(path) == {(4, "modified")}  # record 5 no longer chains to record 4


def test_verify_detects_deleted_records(tmp_path):
    path = filled(tmp_path / "a.db", 6)
    tamper(path, "DELETE FROM records WHERE seq = 2")
    assert problems(path) == {(2, "deleted")}
    tamper(path, "DELETE FROM records WHERE seq = 6")  # the newest: caught by the head kept apart
    assert problems(path) == {(2, "deleted"), (6, "deleted")}


def test_verify_detects_reordered_records(tmp_path):
    path = filled(tmp_path / "a.db", 6)
    # Swap the contents of rows 2 and 5 (each keeps its own hashes): the order is the only thing changed.
    cols = "time, kind, body, prev_hash, hash"
    conn = sqlite3.connect(str(path))
    two, five = (conn.execute(f"SELECT {cols} FROM records WHERE seq = ?", (s,)).fetchone() for s in (2, 5))
    for seq, row in ((2, five), (5, two)):
        conn.execute("UPDATE records SET time = ?, kind = ?, body = ?, prev_hash = ?, hash = ? WHERE seq = ?",
                     (*row, seq))
    conn.commit()
    conn.close()
    assert problems(path) == {(2, "reordered"), (5, "reordered")}


def test_concurrent_appends_from_threads_keep_one_valid_chain(tmp_path):
    path = tmp_path / "a.db"
    log = AuditLog(path)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(15):
                log.append(request_record(100 * t + i))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    assert not errors
    report = verify(path)
    assert report.ok and report.records == 120
    assert sorted(r["request_id"] for r in export(path)) == sorted(f"req-{100 * t + i}" for t in range(8)
                                                                   for i in range(15))


_WRITER = """
import sys
from meshlm.serve.audit import AuditLog
log = AuditLog(sys.argv[1])
print("ready", flush=True)
i = 0
while True:
    log.append({"kind": "request", "request_id": f"{sys.argv[2]}-{i}", "prompt": "mail me at a.b@example.com"})
    i += 1
"""


def writer_count(path: Path, writer: str) -> int:
    conn = sqlite3.connect(str(path), timeout=30)
    try:
        return conn.execute("SELECT count(*) FROM records WHERE body LIKE ?", (f'%"{writer}-%',)).fetchone()[0]
    finally:
        conn.close()


def test_writers_killed_mid_append_leave_a_valid_chain(tmp_path):
    """Two processes append to one file and are SIGKILLed mid-stream: every record is whole, the chain valid."""
    path = tmp_path / "a.db"
    AuditLog(path).close()
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), f"p{k}"], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True) for k in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(writer_count(path, f"p{k}") >= 5 for k in range(2)):
            time.sleep(0.1)  # until both writers are well into their loops (a loaded machine may starve one)
    finally:
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
    report = verify(path)
    assert report.ok, report.to_json()
    assert report.records > 10
    ids = {r["request_id"].split("-")[0] for r in export(path)}
    assert ids == {"p0", "p1"}
    with AuditLog(path) as log:  # and the log goes on after the crash
        assert log.append({"kind": "admin", "action": "restart"})["seq"] == report.records + 1


def run_cli(capfd, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        meshlm_main(list(argv))
    out, err = capfd.readouterr()
    return exit_info.value.code, out, err


def test_cli_verify_and_export(tmp_path, capfd):
    path = str(filled(tmp_path / "a.db", 4))
    code, out, _ = run_cli(capfd, "audit", "verify", path, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["records"] == 4 and doc["problems"] == []
    code, out, _ = run_cli(capfd, "audit", "verify", path)
    assert code == 0 and "intact" in out

    records = json.loads(run_cli(capfd, "audit", "export", path, "--json")[1])
    assert [r["seq"] for r in records] == [1, 2, 3, 4]
    cutoff = records[2]["time"]
    later = json.loads(run_cli(capfd, "audit", "export", path, "--since", cutoff, "--json")[1])
    assert [r["seq"] for r in later] == [3, 4]
    assert json.loads(run_cli(capfd, "audit", "export", path, "--since", "2999-01-01")[1]) == []

    tamper(Path(path), "DELETE FROM records WHERE seq = 2")
    code, out, _ = run_cli(capfd, "audit", "verify", path, "--json")
    doc = json.loads(out)
    assert code == 1 and not doc["ok"] and doc["first_bad_seq"] == 2
    assert doc["problems"][0]["problem"] == "deleted"
    code, out, _ = run_cli(capfd, "audit", "verify", path)
    assert code == 1 and "record 2: deleted" in out


def test_cli_bad_input_exits_2_in_one_line(tmp_path, capfd):
    code, out, err = run_cli(capfd, "audit", "verify", str(tmp_path / "missing.db"))
    assert code == 2 and "does not exist" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    (tmp_path / "junk.db").write_text("not a database at all, just text " * 100)
    code, _, err = run_cli(capfd, "audit", "export", str(tmp_path / "junk.db"))
    assert code == 2 and "not a meshlm audit database" in err
    path = str(filled(tmp_path / "a.db", 1))
    code, _, err = run_cli(capfd, "audit", "export", path, "--since", "yesterday")
    assert code == 2 and "--since" in err
    with pytest.raises(AuditLogError):
        verify(tmp_path / "missing.db")
