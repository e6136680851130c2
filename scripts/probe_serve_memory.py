"""Memory and latency of `meshlm serve` under the probes of issue 32: a huge prompt, and streams that never read.

Starts `meshlm serve` on loopback with a random-weight tiny model, samples the server's RSS (/proc/PID/status)
every 0.1 s, and runs:

1. warm-up: two small requests and one of 16 choices (a full batch: its first steps build per-shape caches that
   stay), after which the baseline RSS is taken;
2. the big prompt: one chat request whose message is ``--prompt-mb`` MB of text (under the 8 MiB body cap), while
   a second client sends small requests one after another (their latencies show what the big one costs others);
3. slow readers: ``--readers`` streaming clients (n=16 choices each, with 20 top log-probs a token) that read
   the first 2 KB and then never again, held ``--hold`` seconds, then closed; ``--rounds`` times (a second round
   that grows the RSS again would be a leak, one that does not is memory kept for reuse);
4. idle ``--idle`` seconds (``--long``: 300), then the RSS again.

Then the server is stopped and the audit records of the probes are read back (status, client, completion_tokens).

    python scripts/probe_serve_memory.py            # the working tree
    python scripts/probe_serve_memory.py --code /tmp/old   # an older checkout (its meshlm package) for comparison
    MESHLM_MALLOC_TRIM=0 python scripts/probe_serve_memory.py   # without the server's malloc_trim calls
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Sampler(threading.Thread):
    """The server's RSS every 0.1 s; ``peak()`` since the last ``reset()``."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.top, self.stop = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.top = max(self.top, rss_mb(self.pid))
            except (FileNotFoundError, ProcessLookupError):
                return
            time.sleep(0.1)

    def reset(self) -> None:
        self.top = rss_mb(self.pid)

    def peak(self) -> float:
        return round(self.top, 1)


def start_server(work: Path, code: Path, args: list[str]) -> tuple[subprocess.Popen, str]:
    port_file = work / "port.json"
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "meshlm", "serve", *args, "--port", "0", "--port-file",
                             str(port_file)], cwd=code, env=env, stdout=subprocess.DEVNULL,
                            stderr=(work / "server.log").open("w"))
    deadline = time.monotonic() + 300
    while not port_file.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("server did not start:\n" + (work / "server.log").read_text()[-3000:])
        time.sleep(0.1)
    return proc, json.loads(port_file.read_text())["url"]


def big_prompt(url: str, megabytes: float) -> dict:
    """One huge chat request beside a stream of small ones; the small ones' latencies."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
    text = ("The quick brown fox jumps over the lazy dog. " * int(megabytes * 1e6 / 45 + 1))[:int(megabytes * 1e6)]
    small: list[float] = []
    done = threading.Event()

    def neighbour() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            client.chat.completions.create(model="probe", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=8, temperature=0)
            small.append(time.perf_counter() - t0)

    thread = threading.Thread(target=neighbour, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    try:
        client.chat.completions.create(model="probe", messages=[{"role": "user", "content": text}], max_tokens=8)
        outcome = "200"
    except openai.APIStatusError as exc:
        outcome = f"{exc.status_code} {exc.body.get('code') if isinstance(exc.body, dict) else ''}"
    big_s = time.perf_counter() - t0
    time.sleep(1.0)
    done.set()
    thread.join(60)
    return {"prompt_mb": megabytes, "outcome": outcome, "big_request_s": round(big_s, 2),
            "neighbour_requests": len(small), "neighbour_max_s": round(max(small, default=0.0), 3),
            "neighbour_median_s": round(sorted(small)[len(small) // 2], 3) if small else None}


def slow_readers(url: str, readers: int, hold: float, max_tokens: int, top_logprobs: int) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    extra = {"logprobs": True, "top_logprobs": top_logprobs} if top_logprobs else {}
    body = json.dumps({"model": "probe", "messages": [{"role": "user", "content": "Tell me a story."}],
                       "stream": True, "n": 16, "max_tokens": max_tokens, "temperature": 1.0, **extra}).encode()
    socks = []
    for _ in range(readers):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: probe\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        sock.recv(2048)  # the first few KB, as the clients read, then never again
        socks.append(sock)
    time.sleep(hold)
    return socks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--code", default=str(ROOT), help="the checkout whose meshlm package serves (default: this one)")
    p.add_argument("--flavor", default="debug")
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--prompt-mb", type=float, default=7.9)
    p.add_argument("--readers", type=int, default=10)
    p.add_argument("--reader-tokens", type=int, default=200, help="max_tokens of each slow reader's 16 choices")
    p.add_argument("--reader-logprobs", type=int, default=20,
                   help="top_logprobs of the slow readers (0: none); 20 makes each chunk a few KB, so a stream "
                        "outgrows the kernel's socket buffers (megabytes on loopback)")
    p.add_argument("--hold", type=float, default=20.0, help="seconds the slow readers hold their sockets")
    p.add_argument("--rounds", type=int, default=2, help="rounds of slow readers")
    p.add_argument("--idle", type=float, default=60.0)
    p.add_argument("--long", action="store_true", help="idle 300 s")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    sys.path.insert(0, str(Path(args.code).resolve()))  # its own fixtures: checkpoints its version can load
    from meshlm.serve.audit_verify import export
    from meshlm.serve.fixtures import random_checkpoints
    from meshlm.serve.registry import Registry

    work = Path(tempfile.mkdtemp(prefix="probe-memory-"))
    step, = random_checkpoints(work / "run", args.flavor, args.vocab_size, (1,))
    (work / "report.json").write_text(json.dumps({"gates": {"passed": True}}))
    registry = Registry(work / "reg.sqlite")
    registry.add_checkpoint(step, "probe", work / "report.json")
    registry.close()
    proc, url = start_server(work, Path(args.code), ["--registry", str(work / "reg.sqlite"), "--model", "probe:v1",
                                                     "--audit", str(work / "audit.sqlite"), "--max-batch", "16",
                                                     "--max-tokens-cap", "4096", "--threads", "1"])
    sampler = Sampler(proc.pid)
    sampler.start()
    report: dict = {"code": args.code, "loadavg_before": [round(x, 2) for x in os.getloadavg()],
                    "malloc_trim": os.environ.get("MESHLM_MALLOC_TRIM", "1")}
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        for n in (1, 1, 16):  # a full batch too: its first steps build shape caches that stay (not a leak)
            client.chat.completions.create(model="probe", messages=[{"role": "user", "content": "hi"}], n=n,
                                           max_tokens=64, temperature=1.0)
        report["rss_baseline_mb"] = round(rss_mb(proc.pid), 1)
        sampler.reset()
        report["big_prompt"] = big_prompt(url, args.prompt_mb)
        report["big_prompt"]["rss_peak_mb"] = sampler.peak()
        report["rss_after_big_prompt_mb"] = round(rss_mb(proc.pid), 1)
        sampler.reset()
        report["slow_readers"] = {"readers": args.readers, "rounds": []}
        for _ in range(args.rounds):  # a second round that grows again would be a leak; one that does not, a cache
            socks = slow_readers(url, args.readers, args.hold, args.reader_tokens, args.reader_logprobs)
            held = round(rss_mb(proc.pid), 1)
            for sock in socks:
                sock.close()
            time.sleep(2.0)
            report["slow_readers"]["rounds"].append({"rss_while_held_mb": held,
                                                     "rss_after_close_mb": round(rss_mb(proc.pid), 1)})
        report["slow_readers"]["rss_peak_mb"] = sampler.peak()
        report["rss_peak_mb"] = round(max(report["big_prompt"]["rss_peak_mb"], sampler.peak()), 1)
        idle = 300.0 if args.long else args.idle
        time.sleep(idle)
        report["idle_s"] = idle
        report["rss_after_idle_mb"] = round(rss_mb(proc.pid), 1)
    finally:
        sampler.stop.set()
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    records = [r for r in export(work / "audit.sqlite") if r["kind"] == "request"]
    streams = [r for r in records if r.get("stream")]
    report["slow_readers"]["audit"] = [{k: r.get(k) for k in ("status", "client", "completion_tokens")}
                                       for r in streams]
    report["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(report, indent=1))
        return
    b, s = report["big_prompt"], report["slow_readers"]
    print(f"RSS: baseline {report['rss_baseline_mb']} MB, peak {report['rss_peak_mb']} MB, after "
          f"{report['idle_s']:g} s idle {report['rss_after_idle_mb']} MB (malloc_trim {report['malloc_trim']})")
    print(f"big prompt ({b['prompt_mb']} MB): {b['outcome']} in {b['big_request_s']} s; peak {b['rss_peak_mb']} MB; "
          f"{b['neighbour_requests']} small requests meanwhile, max {b['neighbour_max_s']} s, median "
          f"{b['neighbour_median_s']} s")
    print(f"slow readers ({s['readers']} x n=16, peak {s['rss_peak_mb']} MB), by round: {s['rounds']}")
    print(f"slow readers' audit records: {s['audit']}")
    print(f"load average before {report['loadavg_before']}, after {report['loadavg_after']}")


if __name__ == "__main__":
    main()
