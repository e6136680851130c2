"""Accelerator presets and the local CPU, as the planner sees them.

Bandwidths are *bus* bandwidths in the nccl-tests convention (what a ring all-reduce achieves per rank, so that
time = bytes · 2(n−1)/n / busbw), not link datasheet numbers:
- inside a node: NVLink/Infinity Fabric all-reduce busbw (A100 NVLink3 ≈ 230 GB/s, H100/H200 NVLink4 ≈ 360 GB/s,
  MI300X ≈ 300 GB/s);
- between nodes: the node's total NIC bandwidth (e.g. DGX A100: 8 × 200 Gb/s HDR = 200 GB/s; DGX H100:
  8 × 400 Gb/s NDR = 400 GB/s), shared by the collectives that cross nodes at the same time.
Latency is per ring step (α in the α-β model).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from meshlm.errors import ConfigError
from meshlm.sections import did_you_mean


@dataclass(frozen=True, eq=False)  # identity-hashed (the planner caches per-hardware link costs)
class Hardware:
    name: str
    memory_gib: float  # per device
    peak_flops: dict[str, float]  # dense FLOP/s per device by precision (fp32, bf16, fp16)
    gpus_per_node: int
    intra_node_gbs: float  # GB/s all-reduce bus bandwidth inside a node
    inter_node_gbs: float  # GB/s total NIC bandwidth per node
    intra_latency_us: float = 3.0
    inter_latency_us: float = 8.0
    hbm_gbs: float = 2000.0  # device memory bandwidth (element-wise kernels are bound by it)
    efficiency: float = 0.5  # default achieved / peak matmul FLOP/s (see PRESETS)
    matmul_overhead_us: float = 0.0  # fixed cost per matmul kernel (timing.py; 0: one efficiency for every size)
    measured: bool = False  # peak measured on this machine (cpu) rather than declared

    def peak(self, precision: str) -> float:
        return self.peak_flops["fp32" if precision == "fp32" else "bf16"]

    def describe(self) -> str:
        src = "measured" if self.measured else "declared"
        return (f"{self.name}: {self.memory_gib:g} GiB, {self.peak('bf16') / 1e12:,.1f} TFLOP/s bf16 / "
                f"{self.peak('fp32') / 1e12:,.2f} fp32 ({src}), {self.gpus_per_node} per node, "
                f"{self.intra_node_gbs:g} GB/s inside a node, {self.inter_node_gbs:g} GB/s per node between nodes")


def _gpu(name: str, mem: float, bf16: float, fp32: float, hbm: float, intra: float, inter: float,
         efficiency: float, matmul_overhead_us: float = 0.0) -> Hardware:
    return Hardware(name, mem, {"fp32": fp32, "bf16": bf16, "fp16": bf16}, 8, intra, inter, hbm_gbs=hbm,
                    efficiency=efficiency, matmul_overhead_us=matmul_overhead_us)


# Dense (no sparsity) datasheet peaks, fp32 without TF32; HBM bandwidth from the datasheets. Default
# efficiencies are calibrated on one published run each (docs/planner.md): A100 0.638 on Megatron's 7.5B row
# (Narayanan et al. 2021, Table 1) together with a fixed 20 µs per matmul kernel (timing.py), the round value
# that the table's other rows support (each of them predicted within -8.2%..+8.1% by a t0 fitted on the other
# eight); H100 0.36 on torchtitan's Llama 3.1 8B, FSDP on 8 GPUs (bf16, eager, 500 W power cap), no per-kernel
# term (one published size: nothing to fit it on); H200 and MI300X have no reference here and take the H100 figure.
PRESETS: dict[str, Hardware] = {
    "a100-40gb": _gpu("a100-40gb", 40, 312e12, 19.5e12, 1555, 230, 200, 0.638, 20.0),
    "a100-80gb": _gpu("a100-80gb", 80, 312e12, 19.5e12, 2039, 230, 200, 0.638, 20.0),
    "h100-80gb": _gpu("h100-80gb", 80, 989e12, 67e12, 3350, 360, 400, 0.36),
    "h200-141gb": _gpu("h200-141gb", 141, 989e12, 67e12, 4800, 360, 400, 0.36),
    "mi300x-192gb": _gpu("mi300x-192gb", 192, 1307e12, 163.4e12, 5300, 300, 400, 0.36),
}
NAMES = (*PRESETS, "cpu")
# A GPU as torch.cuda.get_device_name() names it (a substring, upper case) -> the preset whose declared peak a
# training run's MFU divides by (the presets' peaks are the one record of them).
DEVICE_PRESETS = {"A100": "a100-80gb", "H100": "h100-80gb", "H200": "h200-141gb", "MI300X": "mi300x-192gb"}


def declared_peak(device_name: str, precision: str) -> tuple[float, str] | None:
    """(dense peak FLOP/s, the GPU's key) of a GPU named ``device_name`` in ``precision``; None if unknown."""
    for key, preset in DEVICE_PRESETS.items():
        if key in device_name.upper():
            return PRESETS[preset].peak(precision), key
    return None


def machine_memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def cpu_hardware(ranks: int) -> Hardware:
    """This machine as ``ranks`` gloo ranks of one thread each (as ``meshlm train --nproc`` runs them): the
    matmul peak is measured with one thread; memory is the machine's, shared by the ranks. gloo over loopback
    is modelled at ~2 GB/s with ~50 µs per step (a rough figure: CPU comm is not what the planner is for)."""
    import torch

    from meshlm.train.flops import measure_cpu_matmul_peak

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fp32 = measure_cpu_matmul_peak("fp32", seconds=0.3, n=512)
        bf16 = measure_cpu_matmul_peak("bf16", seconds=0.2)
    finally:
        torch.set_num_threads(threads)
    per_node = max(os.cpu_count() or 1, ranks)
    return Hardware("cpu", machine_memory_gib() / max(ranks, 1), {"fp32": fp32, "bf16": bf16, "fp16": bf16},
                    per_node, 2.0, 2.0, 50.0, 50.0, hbm_gbs=10.0, measured=True)


def resolve_hardware(name: str, ranks: int, **overrides) -> Hardware:
    """A preset (or ``cpu``, measured) with explicit overrides (None values are ignored)."""
    if name == "cpu":
        hw = cpu_hardware(ranks)
    elif name in PRESETS:
        hw = PRESETS[name]
    else:
        raise ConfigError(f"--gpu: unknown preset '{name}'{did_you_mean(name, NAMES)}; known: {', '.join(NAMES)}")
    peak = dict(hw.peak_flops)
    for key in ("fp32", "bf16"):
        value = overrides.pop(f"peak_{key}", None)
        if value is not None:
            peak[key] = value
            if key == "bf16":
                peak["fp16"] = value
    changes = {k: v for k, v in overrides.items() if v is not None}
    for key, value in changes.items():
        if value <= 0:
            raise ConfigError(f"--{key.replace('_', '-')} must be positive, got {value}")
    if any(v <= 0 for v in peak.values()):
        raise ConfigError("peak FLOP/s must be positive")
    if "gpus_per_node" in changes:
        changes["gpus_per_node"] = int(changes["gpus_per_node"])
    return dataclasses.replace(hw, peak_flops=peak, **changes)
