"""The kernels behind a CPU decode step, at SmolLM2-135M's shapes: how fast memory reads, and fp32 against int8 products.

1. Read rates of a 512 MB fp32 buffer: ``sum``, ``copy_`` (read + write bytes) and ``x @ W`` for 1 and 16 rows,
   on 1 and 2 threads — the bound a decode step of fp32 weights cannot beat.
2. For each decode matrix (30 q/k/v-sized, 30 gate/up, 30 down and the 49k-row head; weights random, (out, in)):
   fp32 ``F.linear`` and FBGEMM's dynamic int8 product (meshlm/generate/int8.py ``Int8Matrix``) at 1, 4 and 16
   rows, and the int8 product's relative error.

    python scripts/bench_decode_kernels.py [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from meshlm.generate.int8 import Int8Matrix


def _ms(fn, repeats: int = 9) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def read_rates() -> None:
    a = torch.ones(128 * 2**20)  # 512 MiB
    b = torch.empty_like(a)
    w = a[:576 * (a.numel() // 576)].view(576, -1)  # (in, out): x @ W streams it
    for threads in (1, 2):
        torch.set_num_threads(threads)
        gb = a.numel() * 4 / 1e9
        x1, x16 = torch.randn(1, 576), torch.randn(16, 576)
        print(f"{threads} thread(s): sum {gb / _ms(a.sum) * 1e3:.1f} GB/s, copy {2 * gb / _ms(lambda: b.copy_(a)) * 1e3:.1f}"
              f" GB/s (read + write), x @ W one row {gb / _ms(lambda: x1 @ w) * 1e3:.1f} GB/s, 16 rows "
              f"{gb / _ms(lambda: x16 @ w) * 1e3:.1f} GB/s", flush=True)


def products(threads: int) -> None:
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    for name, out, inp, count in [("q/k/v", 960, 576, 30), ("gate/up", 3072, 576, 30), ("down", 576, 1536, 30),
                                  ("head", 49152, 576, 1)]:
        weights = [torch.randn(out, inp, generator=g) * 0.05 for _ in range(count)]
        packed = [Int8Matrix(w) for w in weights]
        for rows in (1, 4, 16):
            x = torch.randn(rows, inp, generator=g)
            fp32 = _ms(lambda: [F.linear(x, w) for w in weights])
            int8 = _ms(lambda: [m(x) for m in packed])
            want = F.linear(x, weights[0])
            err = float((packed[0](x) - want).norm() / want.norm())
            print(f"{threads} thread(s) {count} × {name} ({out} × {inp}), {rows:2d} rows: fp32 {fp32:6.2f} ms, int8 "
                  f"{int8:6.2f} ms ({fp32 / int8:.1f}×), int8 relative error {err:.4f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="threads for the product comparison")
    args = ap.parse_args()
    read_rates()
    products(args.threads)


if __name__ == "__main__":
    main()
