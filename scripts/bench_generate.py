"""Decoding and CLI start-up figures for docs/benchmarks.md ("Decoding", "Start-up").

    python scripts/bench_generate.py --startup                       # meshlm --help, config keys, an argument error
    python scripts/bench_generate.py --checkpoint /tmp/runs/smol     # batch 1 and 16 vs transformers, fast and plain
    python scripts/bench_generate.py --checkpoint /tmp/runs/smol --profile --batches 1   # ops of 5 decode steps

Each decode line is one ``meshlm bench generate`` run in this process (fast path and transformers alternating);
``--plain`` adds the model's plain forward. The machine's load average is printed beside every figure: timings on
a shared machine are only comparable as ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

STARTUP = [["--help"], ["config", "keys"], ["train", "--no-such-flag"]]


def load() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def startup(repeats: int) -> None:
    for argv in STARTUP:
        walls, cpus = [], []
        for _ in range(repeats):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "meshlm", *argv], capture_output=True, check=False)
            walls.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        print(f"meshlm {' '.join(argv):24s} wall median {statistics.median(walls):.2f} s (min {min(walls):.2f}), "
              f"CPU median {statistics.median(cpus):.2f} s; load {load()}")


def decode(checkpoint: str, batches: list[int], prompt_len: int, new_tokens: int, repeats: int, plain: bool) -> None:
    import torch

    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.generate.bench import bench_generate

    model = model_from_checkpoint(checkpoint, "cpu")[0]
    for batch in batches:
        for fast in ([True, False] if plain else [True]):
            before = load()
            r = bench_generate(model, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens, repeats=repeats,
                               compare_hf=True, fast=fast)
            print(f"batch {batch:2d} {'fast ' if fast else 'plain'} {r['tokens_per_s']:7.1f} tok/s "
                  f"{r['ms_per_step']:6.1f} ms/step  first {1e3 * r['time_to_first_token_s']:6.1f} ms | HF "
                  f"{r['hf_tokens_per_s']:7.1f} tok/s {r['hf_ms_per_step']:6.1f} ms/step | ratio "
                  f"{r['ratio_to_hf']:.2f} identical {r['hf_identical']} | bound "
                  f"{r['bandwidth_bound_ms_per_step']:.1f} ms ({r['copy_bytes_per_s'] / 1e9:.1f} GB/s) | "
                  f"{torch.get_num_threads()} threads, load {before} -> {load()}", flush=True)


def profile(checkpoint: str, batch: int, prompt_len: int) -> None:
    """Wall and CPU ms per decode step of the fast path and the plain forward, and torch.profiler's top ops."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.generate.decode import fast_forward

    model = model_from_checkpoint(checkpoint, "cpu")[0]
    prompt = torch.randint(0, 1000, (batch, prompt_len), generator=torch.Generator().manual_seed(0))
    token = prompt[:, -1:]
    with torch.inference_mode():
        for name, net in (("fast", fast_forward(model)), ("plain", model)):
            cache = model.new_cache(batch, prompt_len + 20)
            net(prompt, cache=cache, start_pos=0)
            for i in range(3):
                net(token, cache=cache, start_pos=prompt_len + i)
            cpu, wall = time.process_time(), time.perf_counter()
            for i in range(10):
                net(token, cache=cache, start_pos=prompt_len + 3 + i)
            print(f"{name}: {100 * (time.perf_counter() - wall):.1f} ms/step wall, "
                  f"{100 * (time.process_time() - cpu):.1f} ms CPU; load {load()}")
            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                for i in range(5):
                    net(token, cache=cache, start_pos=prompt_len + 13 + i)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--startup", action="store_true")
    p.add_argument("--checkpoint")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--plain", action="store_true", help="also time the plain forward")
    p.add_argument("--profile", action="store_true", help="profile decode steps instead (first of --batches)")
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.startup:
        startup(args.repeats * 2 + 1)
    if args.checkpoint and args.profile:
        profile(args.checkpoint, int(args.batches.split(",")[0]), args.prompt_len)
    elif args.checkpoint:
        decode(args.checkpoint, [int(b) for b in args.batches.split(",")], args.prompt_len, args.new_tokens,
               args.repeats, args.plain)


if __name__ == "__main__":
    main()
