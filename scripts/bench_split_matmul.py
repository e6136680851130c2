"""The batch-1 decode products of a checkpoint, as ``mm`` on one (in, out) matrix against the row pack's column
blocks (meshlm/generate/split.py), on 1 and on all of the process's threads, alternating (medians of ``--repeats``).

    OMP_NUM_THREADS=2 python scripts/bench_split_matmul.py --checkpoint RUN [--repeats 15] [--splits P] [--rows N]

Prints one JSON object: per matrix kind (q/k/v fused, o, gate/up fused, down, head) and in total, the ms of one
step's products of that kind for each layout and thread count. ``--rows N`` multiplies N rows instead of one
(a batch's step; meshlm runs those on the view pack, not on the blocks: this shows what the products alone
cost there). A benchmark, not a test (docs/benchmarks.md "Decoding on
every core").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from meshlm.checkpoint.load import model_from_checkpoint
from meshlm.generate.split import SplitMatrix, row_splits


def matrices(model) -> dict[str, list[torch.Tensor]]:
    """(in, out) fp32 matrices of one batch-1 step, by kind."""
    kinds: dict[str, list[torch.Tensor]] = {"qkv": [], "o": [], "gate_up": [], "down": []}
    for block in model.layers.values():
        attn, ffn = block.attention, block.feed_forward
        kinds["qkv"].append(torch.cat([attn.wq.weight, attn.wk.weight, attn.wv.weight]).t().contiguous())
        kinds["o"].append(attn.wo.weight.t().contiguous())
        kinds["gate_up"].append(torch.cat([ffn.w1.weight, ffn.w3.weight]).t().contiguous())
        kinds["down"].append(ffn.w2.weight.t().contiguous())
    kinds["head"] = [model.output.weight.t().contiguous()]
    return {k: [m.detach() for m in v] for k, v in kinds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--splits", type=int, default=0, help="column blocks (0: the process's cores, as meshlm does)")
    ap.add_argument("--rows", type=int, default=1, help="rows multiplied at once (1: a one-sequence decode step)")
    args = ap.parse_args()
    threads = torch.get_num_threads()
    splits = args.splits or row_splits(torch.device("cpu"))
    model, *_ = model_from_checkpoint(args.checkpoint)
    kinds = matrices(model.eval())
    split = {k: [SplitMatrix(m, splits) for m in v] for k, v in kinds.items()}
    x = {m.shape[0]: torch.randn(args.rows, m.shape[0]) for v in kinds.values() for m in v}
    times: dict[str, list[float]] = {}
    with torch.no_grad():
        for r in range(args.repeats + 1):  # the first round warms up
            for t in sorted({1, threads}):
                torch.set_num_threads(t)
                for layout in ("mm", "split"):
                    for kind in kinds:
                        start = time.perf_counter()
                        if layout == "mm":
                            for m in kinds[kind]:
                                torch.mm(x[m.shape[0]], m)
                        else:
                            for m in split[kind]:
                                m(x[m.shape[0]])
                        if r:
                            times.setdefault(f"{layout} {t}t {kind}", []).append(time.perf_counter() - start)
    torch.set_num_threads(threads)
    out = {"checkpoint": args.checkpoint, "threads": threads, "splits": splits, "rows": args.rows,
           "repeats": args.repeats, "load_average": os.getloadavg()[0],
           "ms": {k: round(1e3 * statistics.median(v), 2) for k, v in times.items()}}
    for t in sorted({1, threads}):
        for layout in ("mm", "split"):
            out["ms"][f"{layout} {t}t total"] = round(sum(out["ms"][f"{layout} {t}t {k}"] for k in kinds), 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
