"""Row-seeded inverse-CDF sampling (PPO/GRPO rollouts, layout-independent) against torch.multinomial with one
generator, in one process: the same model, prompts and shapes, best of 5 rounds each, 1 thread.

Usage: python scripts/bench_sampler.py
"""

import time, torch
from meshlm.generate.rollout import SamplingConfig, rollout
from meshlm.models import build_model, flavor_config
torch.set_num_threads(1)
for flavor in ("debug", "small"):
    model = build_model(flavor_config(flavor), "cpu", seed=1).eval()
    cfg = SamplingConfig(max_new_tokens=64, eos_ids=(), pad_id=0)
    prompts = [[5 + i, 17, 300, 9][: 1 + i % 4] for i in range(32)]
    times = {"generator": [], "row_seeds": []}
    for r in range(5):
        for kind in times:
            t = time.perf_counter()
            if kind == "generator":
                rollout(model, prompts, cfg, generator=torch.Generator().manual_seed(r))
            else:
                rollout(model, prompts, cfg, row_seeds=list(range(r * 100, r * 100 + 32)))
            times[kind].append(time.perf_counter() - t)
    g, s = min(times["generator"]), min(times["row_seeds"])
    print(flavor, f"multinomial {g:.3f}s  row-seeded inverse CDF {s:.3f}s  ratio {s / g:.3f}")
