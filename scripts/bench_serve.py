"""Load test of `meshlm serve` on loopback with the official openai client (bounded in requests and time).

1. Batching: decode tokens/s with 1 stream, then with 16 concurrent streams (same requests), and their ratio.
2. Operations under load: N clients send a mix of streamed/non-streamed chat and completion requests while an
   admin thread starts a rollout of v2 (share 0.3), promotes it and rolls it back. Reported: requests/s, p50/p99
   latency, time to first token (streams), errors, versions served per phase, stickiness of users during the
   rollout, and audit records vs requests sent (read back after the server stops).

The model is a random-weight checkpoint of ``--flavor`` (speed does not depend on what the weights learned).

    python scripts/bench_serve.py --flavor small --clients 16 --requests 192 --json

``--adapters [CKPT]`` measures many LoRA adapters on one base, in this process: decode tokens/s of 16 clients
spread over 4 adapters (one base, per-row adapters in one batch) vs the same 16 clients on one merged model, and
the memory of the 4 adapters vs 4 merged copies of the model.

``--grammar [CKPT]`` measures instead what structured outputs cost per token, in this process: the grammar
engine's mask (compute + advance) per token for json_object and a JSON schema, and decode steps of 8 rows free vs
the same 8 rows under the schema (the engine's own loop; CKPT, e.g. a converted SmolLM2, else the random model).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-admin-token-0123456789abcdef"


def start_server(work: Path, args: list[str]) -> tuple[subprocess.Popen, str]:
    port_file = work / "port.json"
    proc = subprocess.Popen([sys.executable, "-m", "meshlm", "serve", *args, "--port", "0", "--port-file",
                             str(port_file)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=(work / "server.log").open("w"))
    deadline = time.monotonic() + 300
    while not port_file.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("server did not start:\n" + (work / "server.log").read_text()[-3000:])
        time.sleep(0.1)
    return proc, json.loads(port_file.read_text())["url"]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 4)


class Load:
    """Requests sent, with their outcome; thread-safe counters."""

    def __init__(self, url: str) -> None:
        self.url, self.lock, self.sent, self.results = url, threading.Lock(), 0, []

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=600)

    def one(self, client: openai.OpenAI, kind: str, stream: bool, max_tokens: int, user: str, seed: int) -> dict:
        with self.lock:
            self.sent += 1
        t0 = time.perf_counter()
        out = {"kind": kind, "stream": stream, "user": user, "ttft": None, "tokens": 0, "version": None}
        try:
            if kind == "chat":
                call = dict(model="bench", messages=[{"role": "user", "content": f"Tell story {seed}"}])
                create = client.chat.completions.create
            else:
                call, create = dict(model="bench", prompt=f"Once upon a time {seed}"), client.completions.create
            call.update(max_tokens=max_tokens, temperature=1.0, seed=seed, user=user)
            if stream:
                first = last = None
                for chunk in create(**call, stream=True, stream_options={"include_usage": True}):
                    out["version"] = chunk.system_fingerprint
                    text = (chunk.choices[0].delta.content if kind == "chat" else chunk.choices[0].text) \
                        if chunk.choices else None
                    if text:
                        last = time.perf_counter()
                        first = first or last
                    if chunk.usage:
                        out["tokens"] = chunk.usage.completion_tokens
                out["ttft"] = None if first is None else first - t0
                out["decode_s"] = None if first is None else last - first
            else:
                response = create(**call)
                out["version"], out["tokens"] = response.system_fingerprint, response.usage.completion_tokens
            out["status"] = 200
        except openai.APIStatusError as exc:
            out["status"] = exc.status_code
        except openai.APIConnectionError:
            out["status"] = -1
        out["latency"] = time.perf_counter() - t0
        with self.lock:
            self.results.append(out)
        return out


def throughput(load: Load, streams: int, requests_per_stream: int, max_tokens: int) -> dict:
    """Aggregate generated tokens / wall time with ``streams`` concurrent streaming clients."""
    start = len(load.results)

    def worker(i: int) -> None:
        client = load.client()
        for r in range(requests_per_stream):
            load.one(client, "completion", True, max_tokens, f"tp-{i}", seed=1000 * i + r)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = load.results[start:]
    tokens = sum(r["tokens"] for r in done)
    return {"streams": streams, "requests": len(done), "tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 1),
            "ttft_p50_s": percentile([r["ttft"] for r in done if r["ttft"]], .5),
            "errors": sum(r["status"] != 200 for r in done)}


def admin(url: str, path: str, body: dict) -> dict:
    import urllib.request

    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def operations(load: Load, clients: int, total: int, max_tokens: int, deadline: float) -> dict:
    """``clients`` threads share ``total`` requests while the admin thread walks rollout -> promote -> rollback
    (after 20%, 50% and 75% of the requests were sent). A request belongs to a phase when it was sent after the
    admin call that opened the phase returned and finished before the next one began (others span a change)."""
    start = len(load.results)
    counter = iter(range(total))
    lock = threading.Lock()
    marks: list[tuple[str, float, float]] = [("stable v1", 0.0, 0.0)]  # (phase, call began, call returned)

    def worker(i: int) -> None:
        client = load.client()
        while time.monotonic() < deadline:
            with lock:
                n = next(counter, None)
            if n is None:
                return
            kind, stream = [("chat", True), ("chat", False), ("completion", True), ("completion", False)][n % 4]
            t_sent = time.perf_counter()
            result = load.one(client, kind, stream, max_tokens, f"user-{n % 48}", seed=n)
            result["span"] = (t_sent, time.perf_counter())

    def operator() -> None:
        steps = [(0.2, "rollout v2 (share 0.3)", "/admin/rollout", {"version": 2, "share": 0.3}),
                 (0.5, "promoted v2", "/admin/promote", {}), (0.75, "rolled back to v1", "/admin/rollback", {})]
        for fraction, name, path, body in steps:
            while load.sent - sent_before < fraction * total and time.monotonic() < deadline:
                time.sleep(0.01)
            t0 = time.perf_counter()
            admin(load.url, path, body)
            marks.append((name, t0, time.perf_counter()))
    sent_before = load.sent
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)] + [threading.Thread(target=operator)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = load.results[start:]
    by_phase: dict[str, dict[str, int]] = {}
    users: dict[str, set] = {}
    for r in done:
        phase = "spans a change"
        for (name, _, opened), (_, closes, _) in zip(marks, [*marks[1:], ("", float("inf"), 0.0)]):
            if r["span"][0] >= opened and r["span"][1] <= closes:
                phase = name
        versions = by_phase.setdefault(phase, {})
        versions[str(r["version"])] = versions.get(str(r["version"]), 0) + 1
        if phase.startswith("rollout") and r["version"]:
            users.setdefault(r["user"], set()).add(r["version"])
    ok = [r for r in done if r["status"] == 200]
    on_candidate = [u for u, v in users.items() if v == {"bench:v2"}]
    return {"clients": clients, "requests": len(done), "wall_s": round(wall, 2),
            "requests_per_s": round(len(done) / wall, 2), "latency_p50_s": percentile([r["latency"] for r in ok], .5),
            "latency_p99_s": percentile([r["latency"] for r in ok], .99),
            "ttft_p50_s": percentile([r["ttft"] for r in ok if r["ttft"]], .5),
            "ttft_p99_s": percentile([r["ttft"] for r in ok if r["ttft"]], .99),
            "errors": len(done) - len(ok), "statuses": sorted({r["status"] for r in done}),
            "versions_by_phase": by_phase,
            "admin_call_s": {name: round(returned - began, 3) for name, began, returned in marks[1:]},
            "rollout_users": len(users), "rollout_users_on_candidate": len(on_candidate),
            "users_switched_during_rollout": sum(len(v) > 1 for v in users.values())}


BENCH_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    "ok": {"type": "boolean"}}, "required": ["name", "age", "tags", "ok"], "additionalProperties": False}


def grammar_costs(ckpt: Path, rows: int = 8, tokens: int = 48, repeats: int = 3) -> dict:
    """Structured outputs' cost: mask time per token, and engine decode time free vs constrained (medians)."""
    import torch

    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.serve.engine import BatchEngine
    from meshlm.serve.grammar import GrammarEngine
    from meshlm.serve.protocol import Finished, Sampling
    from meshlm.tokenizer import MeshTokenizer

    model, _, _, folder = model_from_checkpoint(ckpt, "cpu")
    model.eval().requires_grad_(False)
    tok = MeshTokenizer.load(folder / "tokenizer.json")
    grammars = GrammarEngine(tok, [tok.eos_id])
    formats = {"json_object": {"type": "json_object"}, "json_schema": {"type": "json_schema",
                                                                       "json_schema": {"schema": BENCH_SCHEMA}}}
    report: dict = {"vocab_size": tok.vocab_size, "rows": rows, "torch_threads": torch.get_num_threads()}
    start = time.perf_counter()
    grammars.masks(formats["json_object"], 1)
    report["tokenizer_setup_s"] = round(time.perf_counter() - start, 3)
    gen = torch.Generator().manual_seed(0)
    for name, fmt in formats.items():  # the mask alone, along a random walk through the grammar
        start = time.perf_counter()
        mask = grammars.masks(fmt, 1)[0]
        compile_s = time.perf_counter() - start
        steps, spent = 0, 0.0
        while steps < 200 and not mask.complete:
            t0 = time.perf_counter()
            allowed = mask.allowed(tok.vocab_size, torch.device("cpu"))
            spent += time.perf_counter() - t0
            choices = allowed.nonzero().flatten()
            token = int(choices[torch.randint(len(choices), (1,), generator=gen)])
            t0 = time.perf_counter()
            mask.advance(token)
            spent += time.perf_counter() - t0
            steps += 1
        report[f"{name}_compile_ms"] = round(compile_s * 1e3, 2)
        report[f"{name}_mask_us_per_token"] = round(spent / steps * 1e6, 1)

    def decode(fmt: dict | None) -> float:
        engine = BatchEngine(model, tok, max_batch=rows, max_queue=rows)
        done = threading.Semaphore(0)
        try:
            sampling = Sampling(max_tokens=tokens, temperature=1.0, seed=1, n=rows)
            masks = grammars.masks(fmt, rows) if fmt else None
            start = time.perf_counter()
            engine.submit_choices(tok.prompt_ids("Describe a person as JSON."), tokens, sampling, frozenset(),
                                  lambda ev: done.release() if isinstance(ev, Finished) else None, masks=masks)
            for _ in range(rows):
                done.acquire()
            elapsed = time.perf_counter() - start
            stats = engine.status()
        finally:
            engine.close()
        return elapsed / max(1, stats["decode_steps"] + stats["prefills"])

    # Rows that stay inside the grammar for all the steps (a long string field), so both runs decode every row
    # every step and the difference is the masks' cost.
    endless = {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"text": {"type": "string", "minLength": 100 * tokens}}, "required": ["text"]}}}
    runs = [(decode(None), decode(endless)) for _ in range(repeats)]  # interleaved pairs
    free, constrained = (statistics.median(r[i] for r in runs) for i in (0, 1))
    report.update(free_ms_per_step=round(free * 1e3, 2), constrained_ms_per_step=round(constrained * 1e3, 2),
                  constrained_over_free=round(constrained / free, 3))
    return report


def adapter_costs(ckpt: Path, work: Path, clients: int = 16, num_adapters: int = 4, tokens: int = 32,
                  rank: int = 16, repeats: int = 3) -> dict:
    """16 clients over 4 adapters on one base vs on one merged model: tokens/s (medians of interleaved runs),
    and the adapters' bytes vs merged copies' bytes."""
    import torch

    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.models.lora import merge_lora
    from meshlm.serve.engine import BatchEngine
    from meshlm.serve.fixtures import random_adapter
    from meshlm.serve.multilora import AdapterBank, lora_tensors
    from meshlm.serve.protocol import Finished, Sampling
    from meshlm.tokenizer import MeshTokenizer

    targets = ("q", "k", "v", "o", "gate", "up", "down")
    adapters = [random_adapter(ckpt, work / f"adapter{i}", seed=i + 1, rank=rank, targets=targets)
                for i in range(num_adapters)]
    base, _, _, folder = model_from_checkpoint(ckpt, "cpu")
    base.requires_grad_(False)
    tok = MeshTokenizer.load(folder / "tokenizer.json")
    bank = AdapterBank(base)
    for i, path in enumerate(adapters):
        bank.add(f"a{i}", lora_tensors(model_from_checkpoint(path, "cpu")[0]))
    merged = model_from_checkpoint(adapters[0], "cpu")[0]
    merge_lora(merged)
    merged.requires_grad_(False)
    unique = {t.data_ptr(): t for k, t in merged.state_dict().items() if ".lora_" not in k}  # tied weights once
    model_bytes = sum(t.numel() * t.element_size() for t in unique.values())
    prompt = tok.prompt_ids("Tell me about the sea.")

    def run(model, with_bank: bool) -> float:
        engine = BatchEngine(model, tok, max_batch=clients, max_queue=clients, bank=bank if with_bank else None)
        done = threading.Semaphore(0)
        try:
            start = time.perf_counter()
            for c in range(clients):
                seq = engine.submit(prompt, tokens, Sampling(max_tokens=tokens, temperature=0.0), frozenset(),
                                    lambda ev: done.release() if isinstance(ev, Finished) else None)
                seq.adapter = 1 + c % num_adapters if with_bank else 0
            for _ in range(clients):
                done.acquire()
            return clients * tokens / (time.perf_counter() - start)
        finally:
            engine.close()

    def run_mode(mode: str) -> float:
        bank.mode = mode
        return run(base, True)

    with torch.inference_mode():  # interleaved triples: a busy machine's drift hits all three alike
        runs = [(run(merged, False), run_mode("grouped"), run_mode("gather")) for _ in range(repeats)]
    merged_tps, adapters_tps, gather_tps = (statistics.median(r[i] for r in runs) for i in (0, 1, 2))
    return {"clients": clients, "adapters": num_adapters, "rank": rank, "targets": list(targets),
            "tokens_per_request": tokens, "merged_tokens_per_s": round(merged_tps, 1),
            "adapters_tokens_per_s": round(adapters_tps, 1),
            "adapters_over_merged": round(adapters_tps / merged_tps, 3),
            "gather_bmm_tokens_per_s": round(gather_tps, 1), "gather_over_merged": round(gather_tps / merged_tps, 3),
            "adapter_bytes": bank.nbytes(), "model_bytes": model_bytes,
            "memory_one_base_plus_adapters": model_bytes + bank.nbytes(),
            "memory_merged_copies": num_adapters * model_bytes, "runs": runs}


def adapters_main(args: argparse.Namespace) -> None:
    from meshlm.serve.fixtures import random_checkpoints

    work = Path(tempfile.mkdtemp(prefix="bench-adapters-"))
    ckpt = Path(args.adapters) if args.adapters else \
        random_checkpoints(work / "base", args.flavor, args.vocab_size, (1,))[0]
    before = [round(x, 2) for x in os.getloadavg()]
    report = {"checkpoint": str(ckpt), **adapter_costs(ckpt, work, repeats=args.repeats), "loadavg_before": before,
              "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(report, indent=None if args.json else 1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--flavor", default="small")
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=192, help="requests in the operations phase")
    p.add_argument("--max-tokens", type=int, default=32, help="per request in the operations phase")
    p.add_argument("--tp-requests", type=int, default=2, help="requests per stream in the batching phase")
    p.add_argument("--repeats", type=int, default=3, help="1-stream / 16-stream pairs (medians reported)")
    p.add_argument("--tp-tokens", type=int, default=64, help="max_tokens per request in the batching phase")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="the server's torch CPU threads")
    p.add_argument("--timeout", type=float, default=900, help="stop sending after this many seconds")
    p.add_argument("--json", action="store_true")
    p.add_argument("--grammar", nargs="?", const="", metavar="CKPT",
                   help="only measure structured outputs' cost (a checkpoint, else a random --flavor model)")
    p.add_argument("--adapters", nargs="?", const="", metavar="CKPT",
                   help="only measure 16 clients over 4 LoRA adapters vs one merged model (a checkpoint, else a "
                        "random --flavor model)")
    args = p.parse_args()
    if args.grammar is not None:
        return grammar_main(args)
    if args.adapters is not None:
        return adapters_main(args)

    from meshlm.serve.audit_verify import export, verify
    from meshlm.serve.fixtures import random_checkpoints
    from meshlm.serve.registry import Registry

    deadline = time.monotonic() + args.timeout
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    steps = random_checkpoints(work / "run", args.flavor, args.vocab_size)
    (work / "report.json").write_text(json.dumps({"gates": {"passed": True}}))
    registry = Registry(work / "reg.sqlite")
    for step in steps:
        registry.add_checkpoint(step, "bench", work / "report.json")
    (work / "token").write_text(TOKEN)
    proc, url = start_server(work, ["--registry", str(work / "reg.sqlite"), "--model", "bench:v1", "--audit",
                                    str(work / "audit.sqlite"), "--admin-token-file", str(work / "token"),
                                    "--max-batch", "16", "--max-queue", "256", "--device", args.device,
                                    "--threads", str(args.threads)])
    load = Load(url)
    report = {"machine": {"cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in os.getloadavg()]},
              "flavor": args.flavor, "device": args.device, "server_threads": args.threads}
    load.one(load.client(), "completion", False, 4, "warmup", 0)  # first-call costs out of the figures
    pairs = [(throughput(load, 1, args.tp_requests, args.tp_tokens),
              throughput(load, 16, args.tp_requests, args.tp_tokens)) for _ in range(args.repeats)]
    single = statistics.median(p[0]["tokens_per_s"] for p in pairs)  # interleaved: a busy machine's drift
    multi = statistics.median(p[1]["tokens_per_s"] for p in pairs)  # hits both alike
    report["batching"] = {"one_stream_tokens_per_s": single, "sixteen_streams_tokens_per_s": multi,
                          "speedup": round(multi / single, 2), "runs": pairs}
    report["operations"] = operations(load, args.clients, args.requests, args.max_tokens, deadline)
    report["machine"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    proc.send_signal(signal.SIGTERM)
    report["server_exit_code"] = proc.wait(120)
    records = export(work / "audit.sqlite")
    report["audit"] = {"request_records": sum(r["kind"] == "request" for r in records), "requests_sent": load.sent,
                       "admin_records": sum(r["kind"] == "admin" for r in records),
                       "chain_ok": verify(work / "audit.sqlite").ok}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    b, o = report["batching"], report["operations"]
    print(f"batching (medians of {args.repeats}): 1 stream {b['one_stream_tokens_per_s']} tok/s, 16 streams "
          f"{b['sixteen_streams_tokens_per_s']} tok/s -> {b['speedup']}x; TTFT p50 1 stream "
          f"{b['runs'][0][0]['ttft_p50_s']} s, 16 streams {b['runs'][0][1]['ttft_p50_s']} s")
    print(f"operations: {o['requests']} requests from {o['clients']} clients in {o['wall_s']} s = "
          f"{o['requests_per_s']} req/s; latency p50 {o['latency_p50_s']} s p99 {o['latency_p99_s']} s; "
          f"TTFT p50 {o['ttft_p50_s']} s p99 {o['ttft_p99_s']} s; errors {o['errors']}")
    print(f"versions by phase: {o['versions_by_phase']}; during the rollout {o['rollout_users_on_candidate']} of "
          f"{o['rollout_users']} users on the candidate, {o['users_switched_during_rollout']} switched")
    print(f"audit: {report['audit']}; load average {report['machine']}")


def grammar_main(args: argparse.Namespace) -> None:
    from meshlm.serve.fixtures import random_checkpoints

    ckpt = Path(args.grammar) if args.grammar else \
        random_checkpoints(Path(tempfile.mkdtemp(prefix="bench-grammar-")), args.flavor, args.vocab_size, (1,))[0]
    before = [round(x, 2) for x in os.getloadavg()]
    report = {"checkpoint": str(ckpt), **grammar_costs(ckpt), "loadavg_before": before,
              "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(report, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
