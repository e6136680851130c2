"""``training.deterministic``: the switches that make a GPU run repeat itself bit for bit.

On CPU meshlm's training is already deterministic run to run (tests/test_trainer.py resumes bitwise without
this key). On CUDA, cuBLAS picks reduction splits by workspace, cuDNN benchmarks algorithms, and some kernels
(index_add, scatter, atomics-based backward passes) accumulate in a scheduling-dependent order; this mode pins
all of them, at some speed cost. docs/trainer.md says what it does and does not cover.
"""

from __future__ import annotations

import os

import torch

# cuBLAS reads this when it creates its handle: it must be set before the first CUDA matmul of the process.
# ":4096:8" is the documented setting for deterministic cuBLAS (CUDA >= 10.2).
CUBLAS_WORKSPACE = ":4096:8"


def configure_determinism(enabled: bool, device: torch.device) -> None:
    """Make every later op of this process pick deterministic kernels (or raise where torch has none)."""
    if not enabled:
        return
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    # Raises at the first op that has no deterministic implementation, naming it: a run that asked for
    # bitwise reproducibility should stop rather than silently lose it.
    torch.use_deterministic_algorithms(True)
