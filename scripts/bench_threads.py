"""The thread policy's table (meshlm/generate/decode.py ``forward_threads``): FastForward forwards of SmolLM2 at
each (batch, new tokens) on 1 and 2 intra-op threads, alternating; median ms and the load average per point.
Decode steps read a 64-position cache; prefills start from an empty one.

    OMP_NUM_THREADS=2 python scripts/bench_threads.py --checkpoint /tmp/real/smol [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from meshlm.checkpoint.load import model_from_checkpoint
from meshlm.generate.decode import FastForward

POINTS = [(1, 1), (4, 1), (16, 1), (64, 1), (1, 8), (1, 32), (1, 128), (1, 512), (4, 32), (16, 32)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    model = model_from_checkpoint(args.checkpoint, "cpu")[0].eval()
    ff = FastForward(model)
    for batch, length in POINTS:
        ff.prepare(batch)
        start = 64 if length == 1 else 0
        cache = model.new_cache(batch, start + length)
        tokens = torch.randint(0, model.cfg.vocab_size, (batch, length))
        times: dict[int, list[float]] = {1: [], 2: []}
        with torch.inference_mode():
            for r in range(args.repeats + 1):  # the first round warms up
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    t = time.perf_counter()
                    ff._forward(tokens, cache, start, None, None)  # below the policy: the count set here
                    if r:
                        times[threads].append(time.perf_counter() - t)
        print(json.dumps({"batch": batch, "tokens": length, "ms_1": 1e3 * statistics.median(times[1]),
                          "ms_2": 1e3 * statistics.median(times[2]), "load": os.getloadavg()[0]}), flush=True)


if __name__ == "__main__":
    main()
