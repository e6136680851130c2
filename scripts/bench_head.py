"""The output head + loss alone: meshlm's fused head (meshlm/models/head.py) against the head's logits followed by
meshlm's chunked cross-entropy and by torch's F.cross_entropy — forward + backward, same inputs, alternating.

    python scripts/bench_head.py                                   # the `small` flavour's head: 1,024 rows, d 256, V 4,096
    python scripts/bench_head.py --rows 2048 --dim 512 --vocab 32768
    python scripts/bench_head.py --step small                      # whole training steps, fused head vs logits

Times are the median thread CPU time with one torch thread (robust on a shared machine; --wall for wall-clock
with the threads torch picks). Also prints what each variant keeps from forward to backward, computed from the
shapes (the tensors each one saves), not measured.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from meshlm.models.head import linear_cross_entropy_sum
from meshlm.objectives.pretrain import NextTokenObjective


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--wall", action="store_true", help="wall-clock time, torch's own thread count")
    p.add_argument("--step", metavar="FLAVOR", help="time whole training steps (batch 8 x 128, fused AdamW) of "
                                                     "FLAVOR instead, alternating the fused head and the logits path")
    args = p.parse_args()
    if not args.wall:
        torch.set_num_threads(1)
    clock = time.perf_counter if args.wall else time.thread_time
    if args.step:
        return whole_steps(args.step, args.iters, clock)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(args.rows, args.dim, generator=g).requires_grad_()
    w = (0.02 * torch.randn(args.vocab, args.dim, generator=g)).requires_grad_()
    labels = torch.randint(0, args.vocab, (args.rows,), generator=g)

    variants = {
        "logits + meshlm chunked cross-entropy": lambda: NextTokenObjective.loss_from_logits(
            F.linear(h, w)[None], labels[None]),
        "logits + F.cross_entropy": lambda: F.cross_entropy(F.linear(h, w), labels, reduction="sum"),
        "fused head (meshlm default)": lambda: linear_cross_entropy_sum(h, w, labels),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.iters):
        for name, fn in variants.items():
            h.grad = w.grad = None
            start = clock()
            fn().backward()
            times[name].append(clock() - start)
    n, d, v = args.rows, args.dim, args.vocab
    kept = {"logits + meshlm chunked cross-entropy": 4 * (n * v + n * d + n),
            "logits + F.cross_entropy": 4 * (n * v + n * d),
            "fused head (meshlm default)": 4 * (n * d + v * d)}
    print(f"# head + loss, fp32, {n} rows x d {d} x V {v}; {'wall' if args.wall else '1 thread, CPU'} time, median "
          f"of {args.iters - 5}; load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| variant | ms (forward + backward) | kept from forward to backward (MiB, from the shapes) |")
    print("|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {1e3 * statistics.median(ts[5:]):.1f} | {kept[name] / 2**20:.1f} |")


def whole_steps(flavor: str, iters: int, clock) -> None:
    """Paired whole-step times of one model, its head switched between the fused loss and logits each step."""
    from meshlm.models import build_model, flavor_config

    cfg = flavor_config(flavor)
    model = build_model(cfg, torch.device("cpu"), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (8, 129), generator=g)
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()}
    objective = NextTokenObjective()
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(iters):
        for fused in (True, False):
            model.output.fused = fused
            start = clock()
            (objective.loss_sum(model, batch) / batch["labels"].numel()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times[fused].append(clock() - start)
    diff = [a - b for a, b in zip(times[True][5:], times[False][5:])]
    print(f"# {flavor}: whole training steps, batch 8 x 128, fp32, median of {iters - 5} paired steps; load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"fused head {1e3 * statistics.median(times[True][5:]):.1f} ms, logits + chunked cross-entropy "
          f"{1e3 * statistics.median(times[False][5:]):.1f} ms, paired difference median "
          f"{1e3 * statistics.median(diff):+.1f} ms")


if __name__ == "__main__":
    main()
