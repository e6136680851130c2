"""Decode-step time of the fast path's weight formats (fp32, int8, int4) in one process, alternating.

For each batch size, every format prefills the same random prompts and then times ``--steps`` decode steps;
rounds alternate between the formats (fp32, int8, int4, fp32, ...) so that a shared machine's load falls on all
alike; the median ms per step of each is reported with the load average. The formats' accuracy is measured by
scripts/bench_int8.py (``--weights int4``).

    OMP_NUM_THREADS=1 python scripts/bench_decode_levers.py --checkpoint /tmp/real/smol --batch 1 16
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


def _steps(model, net: FastForward, prompts: torch.Tensor, steps: int) -> float:
    """ms per decode step after a prefill of ``prompts`` (B, P)."""
    B, P = prompts.shape
    cache = model.new_cache(B, P + steps + 1)
    logits = net(prompts, cache=cache, start_pos=0)
    start = time.perf_counter()
    for i in range(steps):
        logits = net(logits[:, -1].argmax(-1, keepdim=True), cache=cache, start_pos=P + i)
    return 1e3 * (time.perf_counter() - start) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--weights", nargs="+", default=["fp32", "int8", "int4"])
    args = ap.parse_args()
    model = model_from_checkpoint(args.checkpoint, "cpu")[0].eval()
    nets = {w: FastForward(model, w) for w in args.weights}
    for batch in args.batch:
        for net in nets.values():
            net.prepare(batch)
        prompts = torch.randint(0, model.cfg.vocab_size, (batch, args.prompt_len),
                                generator=torch.Generator().manual_seed(0))
        times = {w: [] for w in nets}
        load_start = os.getloadavg()[0]
        with torch.inference_mode():
            for round_ in range(args.rounds + 1):  # the first round warms up
                for w, net in nets.items():
                    ms = _steps(model, net, prompts, args.steps)
                    if round_:
                        times[w].append(ms)
        row = {"batch": batch, "threads": torch.get_num_threads(), "load_start": load_start,
               "load_end": os.getloadavg()[0], **{f"ms_per_step_{w}": statistics.median(t) for w, t in times.items()}}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
