"""FLOPs per token and peak FLOP/s, for MFU."""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from meshlm.models import counts
from meshlm.models.config import ModelConfig


def model_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token of a meshlm model: 6 per matmul weight (forward + backward) plus attention's
    scores and values over each layer's context (meshlm/models/counts.py, the one count the planner uses too).
    Recompute is not counted (MFU)."""
    return counts.model_flops_per_token(counts.shape_of(cfg), seq_len)


def module_flops_per_token(model: nn.Module) -> float:
    """Training FLOPs per position of a module not described by a ModelConfig (a model given to the Trainer),
    counted from its matrix weights alone (embedding tables excluded, no attention term): 2 per weight for the
    forward pass and 2 for the backward pass's input gradient, plus 2 for the weight gradient of trainable
    weights (6 per weight when all train, as model_flops_per_token counts). The trainer multiplies it by the
    input positions it ran (its MFU)."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    weights = [p for p in model.parameters() if p.ndim >= 2 and id(p) not in tables]
    return float(sum(4 * p.numel() + (2 * p.numel() if p.requires_grad else 0) for p in weights))


def measure_cpu_matmul_peak(precision: str = "fp32", seconds: float = 0.5, n: int = 1024) -> float:
    """Achievable matmul FLOP/s on this CPU with the current thread count: the best of several short windows
    (a window slowed by another process would under-state the peak, and so over-state MFU)."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    if dtype != torch.float32:
        n = 256  # low-precision CPU matmul is ~100x slower here; keep the probe short
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm-up
    best, window = 0.0, seconds / 5
    deadline = time.perf_counter() + seconds
    while True:
        iters, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            iters += 1
            elapsed = time.perf_counter() - start
            if elapsed >= window:
                break
        best = max(best, 2.0 * n**3 * iters / elapsed)
        if time.perf_counter() >= deadline:
            return best


def cpu_core_matmul_peak(precision: str = "fp32", seconds: float = 0.3, n: int = 1024) -> float:
    """Matmul FLOP/s of one core: one thread, timed by that thread's own CPU time, so other processes (other
    ranks, other users) that slow the wall clock do not lower it."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    n = n if dtype == torch.float32 else 256  # low-precision CPU matmul is ~100x slower here
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread runs inline: thread_time() sees all of its work, no spinning peers
    try:
        torch.mm(a, b)  # warm-up
        iters, start = 0, time.thread_time()
        while time.thread_time() - start < seconds:
            torch.mm(a, b)
            iters += 1
        return 2.0 * n**3 * iters / (time.thread_time() - start)
    finally:
        torch.set_num_threads(threads)


def cpu_share(num_threads: int, local_ranks: int) -> float:
    """Cores one rank can use: its threads, but no more than its share of the cores the local ranks share."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(float(num_threads), cores / max(local_ranks, 1))


def cpu_peak_flops(precision: str) -> tuple[float, str]:
    """Per-rank CPU peak = one core's measured matmul rate x the cores this rank can use. Summed over the ranks
    of a host it never exceeds the host's cores x one core's rate, so MFU stays <= 100% however many ranks
    share the cores (probing each rank's wall-clock rate, ranks sharing cores reported up to 165%)."""
    core = cpu_core_matmul_peak(precision)
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun's ranks on this host
    share = cpu_share(torch.get_num_threads(), local_ranks)
    return core * share, (f"measured CPU matmul peak: {core / 1e9:.1f} GFLOP/s per core x {share:g} core(s) "
                          f"per rank, {local_ranks} rank(s) on this host")


def peak_flops(device: torch.device, precision: str) -> tuple[float, str]:
    """(peak FLOP/s per rank, where it came from) for MFU."""
    if device.type == "cuda":
        from meshlm.planner.hardware import declared_peak

        name = torch.cuda.get_device_name(device)
        declared = declared_peak(name, precision)
        if declared is not None:
            return declared[0], f"declared peak of {declared[1]}"
        return float("nan"), f"unknown GPU '{name}' (no declared peak; MFU not reported)"
    return cpu_peak_flops(precision)
