"""Whole decode steps of SmolLM2 with the operands-swapped products (decode.py ``_swapped``) up to 32 rows and with
none, alternating, at batch 2-32 after 32-token prompts: the measurement behind ``SWAP_MAX_ROWS``.

    OMP_NUM_THREADS=1 python scripts/bench_swap_rows.py   # reads /tmp/real/smol
"""
import time, statistics, torch, os, json
import meshlm.generate.decode as d
from meshlm.checkpoint.load import model_from_checkpoint
model = model_from_checkpoint("/tmp/real/smol", "cpu")[0].eval()
ff = d.FastForward(model)
P, steps = 32, 6
for B in (2, 4, 8, 16, 32):
    ff.prepare(B)
    prompts = torch.randint(0, 1000, (B, P), generator=torch.Generator().manual_seed(0))
    t = {32: [], 0: []}
    load = os.getloadavg()[0]
    with torch.inference_mode():
        for r in range(5):
            for swap in (32, 0):
                d.SWAP_MAX_ROWS = swap
                cache = model.new_cache(B, P + steps + 1)
                logits = ff(prompts, cache=cache, start_pos=0)
                s = time.perf_counter()
                for i in range(steps):
                    logits = ff(logits[:, -1].argmax(-1, keepdim=True), cache=cache, start_pos=P + i)
                if r: t[swap].append(1e3 * (time.perf_counter() - s) / steps)
    print(json.dumps({"batch": B, "swapped_ms": round(statistics.median(t[32]), 1), "plain_ms": round(statistics.median(t[0]), 1), "load": [load, os.getloadavg()[0]]}), flush=True)
