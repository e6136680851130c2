"""fp32 matrices split by output columns, so that one row's product runs on every core: the row pack's layout.

A batch-1 decode step multiplies one row by every weight (SmolLM2-135M: 121 products, 538 MB a step). torch's
``mm`` of a (1, in) row by an (in, out) matrix runs on **one** core whatever ``torch.set_num_threads`` says: on
the 2-core development machine the 121 products took 24.5 ms on one thread and 24.6 on two — most of the 28 ms
step. The same products as one ``bmm`` over ``P`` column blocks — the matrix stored as (P, in, out/P), the row
broadcast to (P, 1, in) — spread the blocks over the threads: 13.2 ms on two threads (q/k/v 3.35 → 2.08 ms,
o 2.07 → 1.25, gate/up 9.71 → 4.90, down 5.38 → 2.87, the 49k-row head 4.09 → 2.12), and 24.1 ms on one, as
``mm`` (scripts/bench_split_matmul.py, quiet; docs/benchmarks.md "Decoding on every core"). From ~6 rows the
blocks also beat the unsplit products (16 rows: 39.3 against 55.6 ms), which is why prefills and batches of 5+
rows use them too (packed.py ``pack_variant``). Each output is the same dot product over ``in`` either way; only
the kernel and so the order of the float additions may differ (tests compare the products to ``mm`` within float
tolerance and the greedy tokens exactly).

The blocks are a copy of the weight (its bytes again: SmolLM2-135M, ~538 MB for the whole row pack, against
~400 MB for the unsplit pack it replaces, which kept the down projection as a view); the last block is padded
with zero columns when ``out`` is not a multiple of ``P``, and the padding is cut from the product.
"""

from __future__ import annotations

import functools
import os

import torch

MAX_SPLITS = 8  # blocks per matrix at most: measured at P = 2 and 4 on 2 cores (the same); more cores not measured


@functools.lru_cache(maxsize=None)
def row_splits(device: torch.device) -> int:
    """Column blocks per matrix for a one-row product on ``device``: the cores this process may use (at most
    :data:`MAX_SPLITS`) on CPU, 1 elsewhere (CUDA's one-row products already use the whole GPU). Read once per
    device and process: every forward asks (packed.py ``pack_variant``)."""
    if device.type != "cpu":
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_SPLITS, cores))


class SplitMatrix:
    """x (N, in) -> x @ W (N, out), W (in, out) held as ``splits`` contiguous column blocks (P, in, ⌈out/P⌉)."""

    def __init__(self, matrix: torch.Tensor, splits: int) -> None:
        if matrix.dim() != 2 or splits < 1:
            raise ValueError(f"need an (in, out) matrix and splits >= 1, got {tuple(matrix.shape)} and {splits}")
        rows, cols = matrix.shape
        width = -(-cols // splits)
        blocks = matrix.new_zeros(splits, rows, width)
        for i, block in enumerate(matrix.detach().split(width, dim=1)):
            blocks[i, :, :block.shape[1]] = block
        self.blocks = blocks
        self.shape = (rows, cols)  # as the (in, out) matrices of the other packs

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.addmm(None, x)

    def addmm(self, add: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        """``add`` + x @ W (``add`` None: the product alone); ``add`` (N, out) or (out,)-broadcast.

        One row's (P, 1, width) product already lies in memory as the (1, P·width) row, so it is returned as a
        view, and an ``add`` that is a whole row rides in the product (``baddbmm``) as the residual does in
        ``addmm``: one op a matrix, as in the unsplit pack. Several rows, or padded blocks, need the copy back to
        row order and a separate add."""
        n = x.shape[0]
        p, rows, width = self.blocks.shape
        cols = self.shape[1]
        xb = x.expand(p, n, rows)
        if n == 1 and p * width == cols:
            if add is None:
                return torch.bmm(xb, self.blocks).view(1, cols)  # (P, 1, width): one block per thread
            return torch.baddbmm(add.expand(1, cols).reshape(p, 1, width), xb, self.blocks).view(1, cols)
        out = torch.bmm(xb, self.blocks).transpose(0, 1).reshape(n, p * width)  # (N, P·width): the reshape copies
        if p * width != cols:
            out = out[:, :cols].contiguous()
        return out if add is None else out.add_(add)

    def nbytes(self) -> int:
        return self.blocks.numel() * self.blocks.element_size()

    def dense(self) -> torch.Tensor:
        """The (in, out) matrix the blocks hold (tests)."""
        p, rows, width = self.blocks.shape
        return self.blocks.transpose(0, 1).reshape(rows, p * width)[:, :self.shape[1]]
