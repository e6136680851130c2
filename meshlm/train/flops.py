"""FLOPs per token and peak FLOP/s, for MFU."""

from __future__ import annotations

import time

import torch

from meshlm.models.config import ModelConfig

# Dense peak FLOP/s per GPU by precision (vendor datasheets, no sparsity).
GPU_PEAK_FLOPS: dict[str, dict[str, float]] = {
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "MI300X": {"bf16": 1307e12, "fp16": 1307e12, "fp32": 163.4e12},
}


def model_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 per matmul weight (forward + backward) plus causal-free attention
    scores 12·L·(heads·head_dim)·seq (Kaplan et al. 2020; PaLM appendix B). Recompute is not counted (MFU)."""
    matmul_params = cfg.num_params(include_embedding=False)
    if cfg.tie_embeddings:  # the head still multiplies by the (shared) embedding matrix
        matmul_params += cfg.vocab_size * cfg.dim
    attn = 12 * cfg.n_layers * cfg.n_heads * cfg.resolved_head_dim * seq_len
    return 6.0 * matmul_params + attn


def measure_cpu_matmul_peak(precision: str = "fp32", seconds: float = 0.5, n: int = 1024) -> float:
    """Achievable matmul FLOP/s on this CPU with the current thread count, measured once."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    if dtype != torch.float32:
        n = 256  # low-precision CPU matmul is ~100x slower here; keep the probe short
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm-up
    iters, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        iters += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * n**3 * iters / elapsed


def peak_flops(device: torch.device, precision: str) -> tuple[float, str]:
    """(peak FLOP/s, where it came from) for MFU."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, table in GPU_PEAK_FLOPS.items():
            if key in name.upper():
                return table[precision], f"declared peak of {key}"
        return float("nan"), f"unknown GPU '{name}' (no declared peak; MFU not reported)"
    return measure_cpu_matmul_peak(precision), "measured CPU matmul peak"
