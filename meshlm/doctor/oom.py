"""``meshlm diagnose oom``: will this config fit, and if not, what to change first.

The planner's memory model (meshlm/planner/memory.py, checked against measurement in docs/planner.md) predicts
the bytes per device of the config's own layout. When that exceeds the device, the remedies are tried in the
order the troubleshooting lore teaches, each one cumulative (it keeps what the previous ones allowed):

1. a smaller micro-batch with gradient accumulation (the global batch, hence the training, stays the same;
   under pipelining: more pipeline micro-batches);
2. activation checkpointing (selective, then full: recompute instead of keeping);
3. sharding the data-parallel ranks (FSDP2: ZeRO-3, or ZeRO-2 when it fits and is faster);
4. tensor / pipeline parallelism over the same devices (the planner's search restricted to them).

Within a remedy the fastest variant that fits is chosen (the planner's step-time model), or the least-memory
one when none fits. The first remedy that fits is written as a job config that ``meshlm train`` accepts.
A training run that runs out of memory anyway raises :class:`OutOfMemory`, which names this command.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from meshlm.config.loader import config_to_toml, load_config
from meshlm.errors import ConfigError, UserError
from meshlm.fileio import atomic_write_text
from meshlm.planner.emit import write_config
from meshlm.planner.hardware import resolve_hardware
from meshlm.planner.memory import GIB
from meshlm.planner.plan import _gpus_needed
from meshlm.planner.predict import layout_from_config, predict_rank
from meshlm.planner.runlog import run_hardware
from meshlm.planner.search import _micro_options, evaluate, search
from meshlm.train.callbacks import TrainerCallback, TrainerView, is_out_of_memory  # noqa: F401 (re-exported)

REMEDIES = ("micro-batch", "activation checkpointing", "sharding", "tensor/pipeline parallelism")
_AC_ORDER = ("none", "selective", "full")


class OutOfMemory(UserError):
    """A training step ran out of device (or host) memory; the message carries the planner's breakdown."""


def training_oom_error(view: TrainerView, exc: BaseException) -> OutOfMemory:
    """The one-line error for an out-of-memory step: what ran out, the planner's prediction for this rank, and
    the command that lists the remedies."""
    from meshlm.planner.measure import mesh_coords

    engine = view.engine
    world = engine.dims.world_size
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    try:
        spec, layout, training = layout_from_config(view.cfg, world)
        pred = predict_rank(spec, layout, training, mesh_coords(engine))
        parts = ", ".join(f"{k} {pred[k] / 2**30:.3g}" for k in ("params", "grads", "optimizer", "activations",
                                                                   "buffers"))
        breakdown = f"the planner predicts {pred['total'] / 2**30:.3g} GiB on this rank ({parts} GiB)"
    except UserError as err:
        breakdown = f"the planner cannot model this run ({err})"
    config = Path(view.run_dir) / "config.resolved.toml"
    nproc = f" --nproc {world}" if world > 1 else ""
    hw = run_hardware(view)  # the preset of this device; None for a GPU the planner does not know
    gpu = hw.name if hw else "GPU"
    return OutOfMemory(
        f"out of memory in step {view.step + 1} on rank {engine.rank} ({view.device}): {first[:200]}; "
        f"{breakdown}; run `meshlm diagnose oom {config}{nproc} --gpu {gpu}` for the remedies in order (smaller "
        f"micro-batch, activation checkpointing, sharding, TP/PP) and a config that fits (docs/troubleshooting.md)")


class OomReport(TrainerCallback):
    """Turns a training step's out-of-memory failure into :func:`training_oom_error`'s one line."""

    def on_oom(self, view: TrainerView, exc: BaseException) -> OutOfMemory:
        return training_oom_error(view, exc)


# ----------------------------------------------------------------------------------------------- remedies
@dataclass
class Remedy:
    name: str
    change: str  # what differs from the config, in words
    evaluation: Any  # meshlm.planner.search.Evaluation
    available: bool = True

    @property
    def fits(self) -> bool:
        return self.available and self.evaluation is not None and self.evaluation.feasible


def _micro_variants(layout, training) -> list:
    """The layout with every smaller micro-batch (accumulation keeps the global batch), largest first."""
    local = max(training.global_batch // layout.dp, 1)
    if layout.pp > 1:
        return [replace(layout, microbatches=m) for m in _micro_options(local, layout.pp) if m >= layout.microbatches]
    current = layout.micro_batch_size or local
    return [replace(layout, micro_batch_size=m) for m in _micro_options(local, 1) if m <= current]


def _ac_variants(layout) -> list:
    start = _AC_ORDER.index(layout.activation_checkpointing)
    return [replace(layout, activation_checkpointing=ac) for ac in _AC_ORDER[start:]]


def _best(evaluations: list):
    """The fastest that fits, else the one needing the least memory."""
    fitting = [ev for ev in evaluations if ev.feasible]
    if fitting:
        return min(fitting, key=lambda ev: ev.time.step_time_s)
    return min(evaluations, key=lambda ev: ev.memory.total) if evaluations else None


def _describe_change(base, layout) -> str:
    bits = []
    if layout.micro_batch_size != base.micro_batch_size and layout.pp == 1:
        bits.append(f"training.micro_batch_size={layout.micro_batch_size}")
    if layout.microbatches != base.microbatches and layout.pp > 1:
        bits.append(f"parallel.microbatches={layout.microbatches}")
    if layout.activation_checkpointing != base.activation_checkpointing:
        bits.append(f"training.activation_checkpointing={layout.activation_checkpointing}")
    for key in ("dp_replicate", "dp_shard", "tp", "pp"):
        if getattr(layout, key) != getattr(base, key):
            bits.append(f"parallel.{key}={getattr(layout, key)}")
    if layout.sharding == "zero2" and base.sharding != "zero2":
        bits.append("parallel.reshard_after_forward=never")
    return ", ".join(bits) or "no change"


def remedies(spec, hw, training, base, headroom: float) -> tuple[Any, list[Remedy]]:
    """(the config's own evaluation, the remedies in order, each cumulative)."""
    def ev(layout):
        return evaluate(spec, layout, training, hw, headroom, exact=True)

    current = ev(base)
    out: list[Remedy] = []
    # each remedy's variants use it (with the earlier ones as needed): its row shows what it achieves
    micro = _micro_variants(base, training)
    smaller = [lay for lay in micro if lay != base]
    out.append(Remedy(REMEDIES[0], "" if smaller else "the micro-batch is already one sequence",
                      _best([ev(lay) for lay in smaller]), bool(smaller)))
    checkpointed = [a for lay in micro for a in _ac_variants(lay)]
    more_ac = [lay for lay in checkpointed if lay.activation_checkpointing != base.activation_checkpointing]
    out.append(Remedy(REMEDIES[1], "" if more_ac else "already full activation checkpointing",
                      _best([ev(lay) for lay in more_ac]), bool(more_ac)))
    if base.dp > 1:
        sharded = [replace(lay, dp_replicate=1, dp_shard=base.dp, sharding=sharding)
                   for lay in checkpointed for sharding in ("zero3", "zero2")]
        out.append(Remedy(REMEDIES[2], "", _best([ev(lay) for lay in sharded])))
    else:
        out.append(Remedy(REMEDIES[2], "one data-parallel rank: nothing to shard over (more devices: --nproc)",
                          None, False))
    if base.world > 1:
        result = search(spec, hw, training, base.world, None, headroom, top=0)
        model_parallel = [e for e in result.fitting if e.layout.tp > 1 or e.layout.pp > 1]
        tried = [e for e in result.rejected.values() if (e.layout.tp > 1 or e.layout.pp > 1) and e.memory.total]
        best = _best([ev(e.layout) for e in model_parallel] or [ev(e.layout) for e in tried])
        out.append(Remedy(REMEDIES[3], "", best, best is not None))
    else:
        out.append(Remedy(REMEDIES[3], "one device: no tensor or pipeline parallelism (more devices: --nproc)",
                          None, False))
    for r in out:
        if r.evaluation is not None and not r.change:
            r.change = _describe_change(base, r.evaluation.layout)
    return current, out


# -------------------------------------------------------------------------------------------------- report
def hardware_for(name: str | None, nproc: int, memory_gib: float | None):
    """A planner preset, ``cpu`` (this machine, measured), or by default the device this machine would train on."""
    if name is None:
        import torch

        if torch.cuda.is_available():
            raise ConfigError("diagnose oom: name the GPU with --gpu (a100-40gb, a100-80gb, h100-80gb, h200-141gb, "
                              "mi300x-192gb)")
        name = "cpu"
    return resolve_hardware(name, nproc, memory_gib=memory_gib)


def diagnose(config: str | None, overrides: list[str], nproc: int, gpu: str | None, memory_gib: float | None,
             headroom: float, emit_path: str | None) -> dict[str, Any]:
    if nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {nproc}")
    if not 0 < headroom <= 1:
        raise ConfigError(f"--headroom must be in (0, 1], got {headroom}")
    cfg = load_config(config, overrides)
    hw = hardware_for(gpu, nproc, memory_gib)
    spec, base, training = layout_from_config(cfg, nproc, efficiency=hw.efficiency)
    current, steps = remedies(spec, hw, training, base, headroom)
    usable = hw.memory_gib * headroom
    report: dict[str, Any] = {
        "config": config, "nproc": nproc, "hardware": hw.name, "usable_gib": usable, "layout": base.describe(),
        "predicted": _row(current, None), "fits": current.feasible, "remedies": [], "recommended": None,
        "emitted_config": None, "config_toml": None, "devices_needed": None}
    first = None
    for r in steps:
        row = {"remedy": r.name, "available": r.available, "change": r.change,
               **(_row(r.evaluation, current) if r.evaluation is not None else {})}
        row["fits"] = r.fits
        report["remedies"].append(row)
        if first is None and r.fits and not current.feasible:
            first = r
    if first is not None:
        report["recommended"] = first.name
        base_sections = tomllib.loads(config_to_toml(cfg))
        text, path = _emit(spec, first.evaluation.layout, training, cfg.training.device, base_sections, emit_path,
                           f"written by: meshlm diagnose oom {config or ''} --nproc {nproc} --gpu {hw.name}\n"
                           f"remedy: {first.name}: {first.change}; predicted "
                           f"{first.evaluation.memory.total / GIB:.3g} GiB per device of {usable:.3g} usable")
        report["config_toml"], report["emitted_config"] = text, path
    elif not current.feasible:
        report["devices_needed"] = _gpus_needed(spec, hw, training, nproc, headroom)
    return report


def _row(ev, reference) -> dict[str, Any]:
    out: dict[str, Any] = {"layout": ev.layout.describe(), "micro_batch_size": ev.layout.micro_batch_size,
                           "activation_checkpointing": ev.layout.activation_checkpointing,
                           "memory_gib": ev.memory.gib(), "reason": ev.reason}
    if ev.time is not None:
        out["step_time_s"] = ev.time.step_time_s
        if reference is not None and reference.time is not None:
            out["step_time_ratio"] = ev.time.step_time_s / reference.time.step_time_s
    if not ev.memory.total:
        out["memory_gib"] = None
    return out


def _emit(spec, layout, training, device: str, base: dict[str, Any], path: str | None,
          header: str) -> tuple[str, str | None]:
    """The fitting config as TOML text (checked by meshlm's loader and layout checks), written when asked."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="meshlm-oom-") as tmp:
        text = write_config(Path(tmp) / "fit.toml", spec, layout, training, device, base, header).read_text()
    if path is not None:
        atomic_write_text(Path(path), text)
    return text, path
