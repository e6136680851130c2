"""What ``meshlm serve --speculative ngram`` changes for one client: each chat's end-to-end time and tokens/s, greedy
(or sampled with ``--temperature T --seed S``), against the same server without it, and whether the replies are
identical (a seeded sampled reply is the same with and without speculation).

Two servers on loopback load the same checkpoint (fp32, ``--threads`` each), one with ``--speculative ngram``; the
official openai client sends each chat of scripts/bench_speculative.py (answers that repeat their prompt — a rewrite,
a correction, code to edit, a quote — and two that do not) to one server and then the other, alternating which goes
first, ``--repeats`` times; one request at a time, so the speculative server's lone row verifies drafts.
With ``--llama-server BIN`` llama.cpp's server answers the same chats too (same temperature and seed; its own
sampler, so its sampled replies differ; ``--threads`` threads, one slot),
on the f32 GGUF export of the checkpoint (the same weights) and on each ``--gguf`` file; every server is asked in
turn, in a rotating order.

    python scripts/bench_serve_speculative.py --checkpoint runs/smol/checkpoints/step-00000000 --json \
        [--llama-server BUILD/bin/llama-server --gguf SmolLM2-135M-Instruct.Q4_1.gguf]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_llamacpp import llama_server  # noqa: E402
from bench_prefix import status  # noqa: E402
from bench_serve import start_server  # noqa: E402
from bench_speculative import CHATS  # noqa: E402


def ask(url: str, message: str, max_tokens: int, temperature: float = 0.0, seed: int | None = None) -> dict:
    """One chat request (greedy unless ``temperature``), not streamed: its end-to-end seconds, completion tokens and
    text."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    t0 = time.perf_counter()
    reply = client.chat.completions.create(model="bench", messages=[{"role": "user", "content": message}],
                                           max_tokens=max_tokens, temperature=temperature, seed=seed)
    seconds = time.perf_counter() - t0
    return {"s": seconds, "tokens": reply.usage.completion_tokens, "text": reply.choices[0].message.content}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a meshlm checkpoint folder (e.g. a converted SmolLM2)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="each server's torch threads")
    p.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary: answer the chats there too")
    p.add_argument("--gguf", action="append", default=[], type=Path, help="more GGUF files for llama-server")
    p.add_argument("--temperature", type=float, default=0.0, help="sample at this temperature (0: greedy)")
    p.add_argument("--seed", type=int, default=None, help="the sampled requests' seed")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.temperature > 0 and args.seed is None:
        p.error("--temperature above 0 needs --seed: the repeats must give the same reply to be timed together")

    from meshlm.serve.registry import Registry

    work = Path(tempfile.mkdtemp(prefix="bench-serve-spec-"))
    (work / "report.json").write_text(json.dumps({"gates": {"passed": True}}))
    Registry(work / "reg.sqlite").add_checkpoint(Path(args.checkpoint), "bench", work / "report.json")
    token = "bench-admin-token-0123456789abcdef"
    (work / "token").write_text(token)
    servers = {}
    for name, extra in (("plain", []), ("speculative", ["--speculative", "ngram"])):
        (work / name).mkdir()
        servers[name] = start_server(work / name, [
            "--registry", str(work / "reg.sqlite"), "--model", "bench:v1", "--audit", str(work / name / "a.sqlite"),
            "--admin-token-file", str(work / "token"), "--threads", str(args.threads), "--prefix-cache-mb", "0",
            *extra])
    urls = {name: url for name, (_, url) in servers.items()}
    with ExitStack() as stack:
        if args.llama_server:
            from meshlm.interop.gguf_export import convert_to_gguf

            export = work / "export-f32.gguf"
            convert_to_gguf(Path(args.checkpoint), export, dtype="f32")
            for gguf in [export, *args.gguf]:
                urls[f"llama.cpp {gguf.name}"] = stack.enter_context(
                    llama_server(args.llama_server, gguf, 1, args.threads, work))
        load_before = os.getloadavg()
        runs: dict[str, dict[str, list[dict]]] = {name: {chat: [] for chat in CHATS} for name in urls}
        names = list(urls)
        try:
            for name in names:  # first-call costs out of the figures
                ask(urls[name], "Say hello.", 4)
            for r in range(args.repeats):
                for i, (chat, (_, message)) in enumerate(CHATS.items()):
                    shift = (r + i) % len(names)
                    for name in names[shift:] + names[:shift]:
                        runs[name][chat].append(ask(urls[name], message, args.max_tokens, args.temperature,
                                                    args.seed))
            stats = status(urls["speculative"], token)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(60)
    chats = {}
    for chat, (repeats_prompt, _) in CHATS.items():
        plain = runs["plain"][chat]
        row = {"repeats_prompt": repeats_prompt, "tokens": plain[0]["tokens"],
               "meshlm_identical": all(x["text"] == plain[0]["text"] for x in plain + runs["speculative"][chat])}
        for name in names:
            median = statistics.median(x["s"] for x in runs[name][chat])
            row[name] = {"s": round(median, 3), "tokens": runs[name][chat][0]["tokens"],
                         "tokens_per_s": round(runs[name][chat][0]["tokens"] / median, 1),
                         "same_text_as_meshlm": runs[name][chat][0]["text"] == plain[0]["text"]}
        row["speedup"] = round(row["plain"]["s"] / row["speculative"]["s"], 3)
        chats[chat] = row
    report = {"machine": {"cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
                          "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
              "checkpoint": args.checkpoint, "max_tokens": args.max_tokens, "repeats": args.repeats,
              "temperature": args.temperature, "seed": args.seed,
              "server_threads": args.threads, "chats": chats,
              "speculative_engine": next(iter(stats.get("loaded", {}).values()), stats)}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for chat, row in chats.items():
            print(f"{chat:10s} repeats prompt {row['repeats_prompt']!s:5s} " + "  ".join(
                f"{name} {row[name]['tokens_per_s']:.1f} tokens/s" for name in names)
                + f"  speculative / plain {row['speedup']:.2f}x  identical {row['meshlm_identical']}")


if __name__ == "__main__":
    main()
