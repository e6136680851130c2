"""``--calibrate``: measure the efficiency factor on this machine with a short training micro-benchmark.

A few forward/backward/AdamW steps of a meshlm model (the planned model when it is a meshlm decoder of at most
:data:`PROBE_PARAMS` parameters, else the ``small`` flavour) on one thread (as each gloo rank runs) — or on the
GPU when there is one — timed after a warm-up. The efficiency is then solved from the planner's own step-time
model on the probe: the planner predicts ``t(e) = A / e + B`` for a single-device step (A: the matmul FLOPs at
the peak, B: the element-wise traffic and fixed costs, which do not scale with the efficiency), so
``e = A / (measured − B)``. Taking achieved FLOP/s over the peak instead would count the element-wise time twice,
once inside the efficiency and once beside it. The result is kept per machine and precision in
``$MESHLM_CACHE/planner-calibration.json``; every training run's own prediction (planner/runlog.py) uses it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from pathlib import Path

from meshlm.config.loader import build_config
from meshlm.errors import ConfigError
from meshlm.planner.hardware import Hardware
from meshlm.planner.layout import Layout, Training
from meshlm.planner.model_spec import ModelSpec, from_model_config
from meshlm.planner.timing import step_time

PROBE_PARAMS = 200e6  # larger models are probed with the `small` flavour's shape
PROBE_BATCH = 4
CALIBRATION_FILE = "planner-calibration.json"  # under $MESHLM_CACHE (default ~/.cache/meshlm)


def calibration_path() -> Path:
    return Path(os.environ.get("MESHLM_CACHE") or Path.home() / ".cache" / "meshlm").expanduser() / CALIBRATION_FILE


def machine_key(hw_name: str, precision: str) -> str:
    """What a calibration holds for: this host's CPU (or the GPU preset) and the precision."""
    where = f"{platform.node()}/{platform.processor() or platform.machine()}" if hw_name == "cpu" else hw_name
    return f"{where}/{precision}"


def save_calibration(hw_name: str, precision: str, efficiency: float) -> Path:
    """Keep a calibrated efficiency for this machine, so that every training run's own prediction
    (planner/runlog.py) uses it; written whole (atomically)."""
    from meshlm.fileio import atomic_write_text

    path = calibration_path()
    known = _read(path)
    known[machine_key(hw_name, precision)] = {"efficiency": efficiency, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(known, indent=1) + "\n")
    return path


def saved_efficiency(hw_name: str, precision: str) -> float | None:
    """The efficiency `meshlm plan --calibrate` measured on this machine, if any (an unreadable file counts as
    none: a prediction must not stop a run)."""
    entry = _read(calibration_path()).get(machine_key(hw_name, precision))
    value = entry.get("efficiency") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, (int, float)) and 0 < value <= 1 else None


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def solve_efficiency(spec: ModelSpec, hw: Hardware, training: Training, measured_s: float) -> float:
    """The efficiency at which the planner's single-device step time for (``spec``, ``training``) on ``hw``
    equals ``measured_s``, clamped to [0.01, 1]."""
    at = {e: step_time(spec, Layout(), dataclasses.replace(training, efficiency=e), hw).step_time_s
          for e in (1.0, 0.5)}
    matmul = at[0.5] - at[1.0]  # A: t(0.5) - t(1) = 2A + B - (A + B)
    fixed = at[1.0] - matmul  # B
    if measured_s <= fixed:
        return 1.0
    return min(max(matmul / (measured_s - fixed), 0.01), 1.0)


def calibrate(spec: ModelSpec, hw: Hardware, precision: str, seq_len: int, steps: int = 3) -> float:
    import torch

    from meshlm.config.schema import OptimizerConfig
    from meshlm.models import build_model, flavor_config
    from meshlm.train.optim import build_optimizer

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
        opt = build_optimizer(model, OptimizerConfig(lr=1e-4))  # the trainer's AdamW
        ids = torch.randint(0, cfg.vocab_size, (PROBE_BATCH, seq), device=device)

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
    return solve_efficiency(probe, hw, Training(seq, PROBE_BATCH, precision), seconds)
