"""meshlm beside llama.cpp on the same model: does llama.cpp load meshlm's GGUF export and generate the same
greedy tokens, and how many tokens/s does each server give one client and 16 concurrent clients?

llama.cpp is not a meshlm dependency. Build its server once from the llama.cpp source that the llama-cpp-python
sdist carries (docs/benchmarks.md, "llama.cpp"), then pass the binary:

    python scripts/bench_llamacpp.py --llama-server BUILD/bin/llama-server --checkpoint RUN \\
        [--gguf ~/.cache/meshlm/models/SmolLM2-135M-Instruct.Q4_1.gguf] [--check-dtypes f32,q8_0] \\
        [--clients 16] [--requests 2] [--new-tokens 64] [--threads 2] [--json]

1. Greedy check (``--check-dtypes``): RUN is exported with ``meshlm convert to-gguf`` at each dtype and served by
   llama-server; for a few prompts, llama.cpp's tokenization of the text is compared with meshlm's, and its greedy
   continuation of meshlm's prompt ids (``/completion`` with top-k 1) with meshlm's own greedy ids.
2. Throughput: the same OpenAI ``/v1/completions`` requests (sampled, temperature 1, ``max_tokens`` new tokens)
   from 1 client and then from ``--clients`` concurrent clients, against ``meshlm serve`` on RUN and against
   llama-server on each GGUF named (``--gguf``, and the f32 export of RUN: the same weights meshlm serves).
   Generated tokens (the servers' usage counts) per second of wall time. Servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
           "Once upon a time, in 2024, there were 3 little pigs"]
CHECK_TOKENS = 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _wait(url: str, proc: subprocess.Popen, log: Path, what: str) -> None:
    deadline = time.monotonic() + 300
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start:\n" + log.read_text()[-3000:])
        time.sleep(0.3)


@contextmanager
def llama_server(binary: str, gguf: Path, slots: int, threads: int, work: Path):
    port = _free_port()
    log = work / f"llama-{gguf.stem}-{slots}.log"
    proc = subprocess.Popen([binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                             "-tb", str(threads), "-np", str(slots), "-c", str(512 * slots)],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        _wait(f"http://127.0.0.1:{port}/health", proc, log, "llama-server")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(60)


def register(run: Path, work: Path) -> None:
    """``run`` as bench:v1 in WORK/reg.sqlite, its safety gates marked passed (a benchmark, not a deployment)."""
    from meshlm.serve.registry import Registry

    (work / "report.json").write_text(json.dumps({"gates": {"passed": True}}))
    Registry(work / "reg.sqlite").add_checkpoint(run, "bench", work / "report.json")


@contextmanager
def meshlm_server(threads: int, work: Path, weights: str = "fp32"):
    """``meshlm serve`` of bench:v1 (:func:`register`) with ``--weights weights``."""
    port_file, log = work / "port.json", work / "meshlm-serve.log"
    port_file.unlink(missing_ok=True)  # an earlier server's
    proc = subprocess.Popen([sys.executable, "-m", "meshlm", "serve", "--registry", str(work / "reg.sqlite"),
                             "--model", "bench:v1", "--audit", str(work / "audit.sqlite"), "--max-batch", "16",
                             "--max-queue", "256", "--device", "cpu", "--threads", str(threads), "--port", "0",
                             "--port-file", str(port_file), "--weights", weights], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        deadline = time.monotonic() + 300
        while not port_file.is_file():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("meshlm serve did not start:\n" + log.read_text()[-3000:])
            time.sleep(0.2)
        yield json.loads(port_file.read_text())["url"]
    finally:
        proc.terminate()
        proc.wait(120)


def throughput(url: str, clients: int, requests: int, new_tokens: int) -> dict:
    """``clients`` threads each send ``requests`` completions; generated tokens / wall seconds."""
    import openai

    counts, errors, lock = [], [], threading.Lock()

    def worker(i: int) -> None:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=900)
        for r in range(requests):
            try:
                out = client.completions.create(model="bench", prompt=f"Once upon a time {1000 * i + r}",
                                                max_tokens=new_tokens, temperature=1.0, seed=1000 * i + r)
                with lock:
                    counts.append(out.usage.completion_tokens)
            except openai.OpenAIError as exc:
                with lock:
                    errors.append(repr(exc)[:200])

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"clients": clients, "requests": len(counts), "tokens": sum(counts), "wall_s": round(wall, 2),
            "tokens_per_s": round(sum(counts) / wall, 1), "errors": errors}


def serve_figures(url: str, args: argparse.Namespace) -> dict:
    throughput(url, 1, 1, 4)  # first-call costs out of the figures
    return {"one_client": throughput(url, 1, args.requests, args.new_tokens),
            "many_clients": throughput(url, args.clients, args.requests, args.new_tokens)}


def greedy_check(args: argparse.Namespace, work: Path, exports: dict[str, Path]) -> list[dict]:
    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.generate import generate
    from meshlm.interop.hf_tokenizer import checkpoint_eos_ids
    from meshlm.tokenizer import MeshTokenizer

    model, _, _, ckpt = model_from_checkpoint(args.checkpoint)
    tok = MeshTokenizer.load(ckpt / "tokenizer.json")
    tok.backend.encode_special_tokens = False  # the prompts' chat markers are the special tokens here
    ids = [tok.backend.encode(p, add_special_tokens=False).ids for p in PROMPTS]
    eos = checkpoint_eos_ids(ckpt, tok.eos_id)
    ours = [generate(model, i, CHECK_TOKENS, greedy=True, eos_id=eos) for i in ids]
    rows = []
    for dtype, gguf in exports.items():
        with llama_server(args.llama_server, gguf, 1, args.threads, work) as url:
            for text, prompt_ids, mine in zip(PROMPTS, ids, ours):
                theirs_tok = _post(url + "/tokenize", {"content": text, "add_special": False,
                                                      "parse_special": True})["tokens"]
                out = _post(url + "/completion", {"prompt": prompt_ids, "n_predict": len(mine), "temperature": 0.0,
                                                  "top_k": 1, "samplers": ["top_k"], "cache_prompt": False,
                                                  "return_tokens": True})
                theirs = [int(t) for t in out["tokens"]]
                first = None if theirs == mine else next(
                    (k for k, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
                rows.append({"dtype": dtype, "prompt": text[:40], "tokenization_equal": theirs_tok == prompt_ids,
                             "greedy_equal": theirs == mine, "tokens": len(mine), "first_difference": first,
                             "meshlm_text": tok.decode(mine), "llama_text": tok.decode(theirs)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-server", required=True, help="the llama-server binary")
    p.add_argument("--checkpoint", required=True, type=Path, help="a meshlm checkpoint (e.g. converted SmolLM2)")
    p.add_argument("--gguf", action="append", default=[], type=Path, help="more GGUF files for llama-server")
    p.add_argument("--check-dtypes", default="f32,q8_0", help="to-gguf dtypes for the greedy check ('' for none)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=2, help="requests per client")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="CPU threads of each server")
    p.add_argument("--no-throughput", action="store_true")
    p.add_argument("--meshlm-weights", default="fp32", help="meshlm serve --weights formats to measure, e.g. fp32,int8")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-llamacpp-") as tmp:  # the exports are hundreds of MB
        report = measure(args, Path(tmp))
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for row in report["greedy"]:
        where = "" if row["greedy_equal"] else f", first difference at token {row['first_difference']}"
        print(f"{row['dtype']}: {row['prompt']!r}: tokenization equal {row['tokenization_equal']}, greedy ids equal "
              f"{row['greedy_equal']} ({row['tokens']} tokens{where})")
    mine = [(f"meshlm serve --weights {w}", report.get("meshlm" if w == "fp32" else f"meshlm {w}"))
            for w in args.meshlm_weights.split(",")]
    for name, figures in mine + list(report.get("llama.cpp", {}).items()):
        if figures:
            print(f"{name}: 1 client {figures['one_client']['tokens_per_s']} tok/s, {args.clients} clients "
                  f"{figures['many_clients']['tokens_per_s']} tok/s (errors {len(figures['many_clients']['errors'])})")
    print(f"load average before {report['load_before']}, after {report['load_after']}")


def measure(args: argparse.Namespace, work: Path) -> dict:
    from meshlm.interop.gguf_export import convert_to_gguf

    dtypes = [d for d in args.check_dtypes.split(",") if d]
    exports = {}
    for dtype in sorted(set(dtypes) | ({"f32"} if not args.no_throughput else set())):
        exports[dtype] = work / f"export-{dtype}.gguf"
        convert_to_gguf(args.checkpoint, exports[dtype], dtype=dtype)
    report = {"load_before": os.getloadavg(), "threads": args.threads,
              "greedy": greedy_check(args, work, {d: exports[d] for d in dtypes})}
    if not args.no_throughput:
        register(args.checkpoint, work)
        for weights in args.meshlm_weights.split(","):
            with meshlm_server(args.threads, work, weights) as url:
                report["meshlm" if weights == "fp32" else f"meshlm {weights}"] = serve_figures(url, args)
        report["llama.cpp"] = {}
        for gguf in [exports["f32"], *args.gguf]:
            with llama_server(args.llama_server, gguf, args.clients, args.threads, work) as url:
                report["llama.cpp"][gguf.name] = serve_figures(url, args)
    report["load_after"] = os.getloadavg()
    return report


if __name__ == "__main__":
    main()
