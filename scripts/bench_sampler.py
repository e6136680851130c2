"""The one sampler's two sources of uniforms in rollouts: a generator per row (PPO/GRPO, layout-independent) against
one shared generator, in one process: the same model, prompts and shapes, best of 5 rounds each, 1 thread.

Usage: python scripts/bench_sampler.py
"""

from __future__ import annotations

import time

import torch

from meshlm.generate.params import SamplingParams
from meshlm.generate.rollout import rollout
from meshlm.models import build_model, flavor_config


def main() -> None:
    torch.set_num_threads(1)
    for flavor in ("debug", "small"):
        model = build_model(flavor_config(flavor), "cpu", seed=1).eval()
        cfg = SamplingParams(max_tokens=64)
        prompts = [[5 + i, 17, 300, 9][: 1 + i % 4] for i in range(32)]
        times: dict[str, list[float]] = {"shared_generator": [], "row_seeds": []}
        for r in range(5):  # alternate, so that machine load hits both alike
            for kind, times_of in times.items():
                start = time.perf_counter()
                if kind == "shared_generator":
                    rollout(model, prompts, cfg, generator=torch.Generator().manual_seed(r))
                else:
                    rollout(model, prompts, cfg, row_seeds=list(range(r * 100, r * 100 + 32)))
                times_of.append(time.perf_counter() - start)
        g, s = min(times["shared_generator"]), min(times["row_seeds"])
        print(f"{flavor}: one shared generator {g:.3f} s, a generator per row {s:.3f} s, ratio {s / g:.3f}")


if __name__ == "__main__":
    main()
