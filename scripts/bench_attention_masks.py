"""Cost of the attention masks: one training step (forward + backward) of the same model and batch with plain
causal attention (sdpa ``is_causal``), packed rows (document ids + position ids: an explicit boolean mask) and a
sliding window, interleaved in the same process so machine noise hits all three alike.

    python scripts/bench_attention_masks.py --flavor small --batch 8 --seq 256 --repeats 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from meshlm.models import build_model, flavor_config
from meshlm.models.llama import positions_from_documents


def step_seconds(model, tokens: torch.Tensor, kwargs: dict) -> float:
    start = time.perf_counter()
    model(tokens, **kwargs).float().logsumexp(-1).mean().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", default="small")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--docs-per-row", type=int, default=4)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = flavor_config(args.flavor)
    plain = build_model(cfg, "cpu", seed=0)
    windowed = build_model(dataclasses.replace(cfg, sliding_window=args.window), "cpu", seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    docs = torch.arange(args.seq).div(args.seq // args.docs_per_row, rounding_mode="floor").expand(args.batch, -1)
    cases = {"plain causal": (plain, {}),
             f"packed ({args.docs_per_row} rows per sequence)": (plain, {"document_ids": docs,
                                                                        "position_ids": positions_from_documents(docs)}),
             f"sliding window {args.window}": (windowed, {})}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for name, (model, kwargs) in cases.items():  # warm-up
        step_seconds(model, tokens, kwargs)
    for _ in range(args.repeats):
        for name, (model, kwargs) in cases.items():
            times[name].append(step_seconds(model, tokens, kwargs))
    base = statistics.median(times["plain causal"])
    result = {name: {"median_s": statistics.median(t), "ratio_to_plain": statistics.median(t) / base}
              for name, t in times.items()}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{args.flavor}, batch {args.batch} x {args.seq}, fp32, {args.threads} threads, median of {args.repeats}:")
    for name, r in result.items():
        print(f"  {name:<32} {r['median_s'] * 1000:8.1f} ms/step  {r['ratio_to_plain']:.2f}x plain")


if __name__ == "__main__":
    main()
