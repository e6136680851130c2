"""Row-seeded inverse-CDF sampling (PPO/GRPO rollouts, layout-independent) against torch.multinomial with one
generator, in one process: the same model, prompts and shapes, best of 5 rounds each, 1 thread.

Usage: python scripts/bench_sampler.py
"""

from __future__ import annotations

import time

import torch

from meshlm.generate.rollout import SamplingConfig, rollout
from meshlm.models import build_model, flavor_config


def main() -> None:
    torch.set_num_threads(1)
    for flavor in ("debug", "small"):
        model = build_model(flavor_config(flavor), "cpu", seed=1).eval()
        cfg = SamplingConfig(max_new_tokens=64, eos_ids=(), pad_id=0)
        prompts = [[5 + i, 17, 300, 9][: 1 + i % 4] for i in range(32)]
        times: dict[str, list[float]] = {"multinomial": [], "row_seeds": []}
        for r in range(5):  # alternate, so that machine load hits both alike
            for kind, times_of in times.items():
                start = time.perf_counter()
                if kind == "multinomial":
                    rollout(model, prompts, cfg, generator=torch.Generator().manual_seed(r))
                else:
                    rollout(model, prompts, cfg, row_seeds=list(range(r * 100, r * 100 + 32)))
                times_of.append(time.perf_counter() - start)
        g, s = min(times["multinomial"]), min(times["row_seeds"])
        print(f"{flavor}: multinomial {g:.3f} s, row-seeded inverse CDF {s:.3f} s, ratio {s / g:.3f}")


if __name__ == "__main__":
    main()
