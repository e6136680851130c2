"""AdamW kernels on this machine: foreach vs fused, one step over the parameters of a flavour (same gradients),
stepped alternately; prints the median step time of each and their largest difference in updated weights.

    python scripts/bench_adamw.py [FLAVOUR] [STEPS]        # default: small 20
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from meshlm.models import build_model, flavor_config


def main() -> None:
    flavor = sys.argv[1] if len(sys.argv) > 1 else "small"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    model = build_model(flavor_config(flavor), "cpu", seed=0)
    grads = [torch.randn_like(p) * 1e-3 for p in model.parameters()]
    optimizers, params = {}, {}
    for kind in ("foreach", "fused"):
        params[kind] = [p.detach().clone().requires_grad_() for p in model.parameters()]
        optimizers[kind] = torch.optim.AdamW(params[kind], lr=1e-3, weight_decay=0.1, **{kind: True})
    times: dict[str, list[float]] = {kind: [] for kind in optimizers}
    for _ in range(steps):
        for kind, opt in optimizers.items():
            for p, g in zip(params[kind], grads):
                p.grad = g.clone()
            start = time.perf_counter()
            opt.step()
            times[kind].append(time.perf_counter() - start)
    for kind, t in times.items():
        print(f"{kind}: median {1e3 * statistics.median(t[2:]):.1f} ms per step ({torch.get_num_threads()} threads)")
    diff = max(float((a - b).detach().abs().max()) for a, b in zip(params["foreach"], params["fused"]))
    print(f"foreach / fused = {statistics.median(times['foreach'][2:]) / statistics.median(times['fused'][2:]):.2f}x; "
          f"max |weight difference| after {steps} steps: {diff:.2e}")


if __name__ == "__main__":
    main()
