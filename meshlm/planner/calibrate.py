"""``--calibrate``: measure the efficiency factor on this machine with a short training micro-benchmark.

A few forward/backward/AdamW steps of a meshlm model (the planned model's width and heads when it fits a
quick probe, else the ``small`` flavour's) on one thread (as each gloo rank runs) — or on the GPU when there is
one — timed after a warm-up; efficiency = achieved model FLOP/s / the matmul peak measured the same way.
"""

from __future__ import annotations

import time

from meshlm.config.loader import build_config
from meshlm.errors import ConfigError
from meshlm.planner.hardware import Hardware
from meshlm.planner.model_spec import ModelSpec, from_model_config
from meshlm.planner.timing import model_flops_per_token

PROBE_PARAMS = 30e6  # larger models are probed with the `small` flavour's shape


def calibrate(spec: ModelSpec, hw: Hardware, precision: str, seq_len: int, steps: int = 3) -> float:
    import torch

    from meshlm.models import build_model, flavor_config

    on_gpu = torch.cuda.is_available() and hw.name != "cpu"
    if hw.name != "cpu" and not on_gpu:
        raise ConfigError(f"--calibrate measures this machine, which has no GPU for '{hw.name}'; use --gpu cpu, "
                          "or pass --efficiency")
    if spec.arch != "llama" or spec.meshlm_model is None or spec.num_params() > PROBE_PARAMS:
        cfg = flavor_config("small")
    else:
        cfg = build_config({"model": dict(spec.meshlm_model)}).model
    probe = from_model_config(cfg)
    seq = min(seq_len, cfg.max_seq_len, 256)
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    threads = torch.get_num_threads()
    if not on_gpu:
        torch.set_num_threads(1)
    try:
        model = build_model(cfg, device, seed=0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        batch = 4
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)

        def step() -> None:
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = model(ids, labels=ids) / ids.numel()  # the training objectives' default head (fused)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()
        if on_gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if on_gpu:
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / steps
    finally:
        torch.set_num_threads(threads)
    achieved = model_flops_per_token(probe, seq) * batch * seq / seconds
    return min(max(achieved / hw.peak(precision), 0.01), 1.0)
