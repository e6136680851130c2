"""Every training run prints the planner's prediction for its own layout at start-up and the measured figures
beside it at the end, and keeps both in ``plan_prediction.json`` in the run directory (rank 0): :class:`PlanLog`,
a trainer callback."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from meshlm.errors import UserError
from meshlm.fileio import atomic_write_text
from meshlm.planner.calibrate import saved_efficiency
from meshlm.planner.hardware import PRESETS, Hardware, machine_memory_gib
from meshlm.planner.predict import layout_from_config, predict_rank
from meshlm.planner.search import evaluate
from meshlm.train.callbacks import TrainerCallback, TrainerView

FILE = "plan_prediction.json"


def run_hardware(view: TrainerView):
    """The planner's Hardware for the device this run trains on (None for an unknown GPU)."""
    import torch

    world = view.engine.dims.world_size
    if view.device.type == "cpu":
        peak = view.peak_flops
        efficiency = saved_efficiency("cpu", view.cfg.training.precision)  # `meshlm plan --calibrate`
        return Hardware("cpu", machine_memory_gib() / world, {"fp32": peak, "bf16": peak, "fp16": peak},
                        max(world, 1), 2.0, 2.0, 50.0, 50.0, hbm_gbs=10.0, measured=True,
                        efficiency=efficiency or Hardware.efficiency)
    name = torch.cuda.get_device_name(view.device).upper()
    mem = torch.cuda.get_device_properties(view.device).total_memory / 2**30
    for key, hw in PRESETS.items():
        if key.split("-")[0].upper() in name and abs(hw.memory_gib - mem) < 0.2 * hw.memory_gib:
            saved = saved_efficiency(hw.name, view.cfg.training.precision)  # `meshlm plan --gpu NAME --calibrate`
            return dataclasses.replace(hw, memory_gib=mem, efficiency=saved or hw.efficiency)
    return None


class PlanLog(TrainerCallback):
    def __init__(self) -> None:
        self.record: dict[str, Any] = {}

    def on_train_start(self, view: TrainerView) -> str:
        """One line with the prediction (rank 0 computes it and writes plan_prediction.json)."""
        if view.rank != 0:
            return ""

        try:
            objective = view.objective
            spec, layout, training = layout_from_config(view.cfg, view.engine.dims.world_size,
                                                        sequences_per_row=objective.sequences_per_row,
                                                        frozen_forwards=objective.frozen_forwards)
            bytes_ = predict_rank(spec, layout, training, {"pp": 0, "tp": 0, "dp_shard": 0})
            hw = run_hardware(view)
            predicted: dict[str, Any] = {k: bytes_[k] / 2**30 for k in
                                         ("params", "grads", "optimizer", "activations", "buffers", "total")}
            predicted["comm_bytes_per_step"] = bytes_["comm_bytes_per_step"]
            if hw is not None:
                training = dataclasses.replace(training, efficiency=hw.efficiency)
                ev = evaluate(spec, layout, training, hw, exact=True).to_json(training, hw)
                predicted.update({k: ev[k] for k in ("step_time_s", "tokens_per_s", "mfu", "comm_share")})
        except UserError as exc:  # a shape the planner cannot model must not stop training
            return f"planner: no prediction for this run ({exc})"
        self.record = {"layout": layout.describe(), "hardware": hw.name if hw else None,
                       "efficiency": training.efficiency, "predicted": predicted}
        self._write(view.run_dir)
        time_part = (f", step {predicted['step_time_s']:.3g} s, {predicted['tokens_per_s']:,.0f} tokens/s"
                     if "step_time_s" in predicted else "")
        return (f"planner: {layout.describe()} predicts {predicted['total']:.3g} GiB per device (rank 0: "
                f"activations {predicted['activations']:.3g}){time_part}, "
                f"{predicted['comm_bytes_per_step']:,} collective bytes per step ({FILE})")

    def on_train_end(self, view: TrainerView) -> str:
        """One line comparing the prediction with what the run measured (metrics.jsonl)."""
        if view.rank != 0 or not self.record:
            return ""
        metrics = Path(view.run_dir) / "metrics.jsonl"
        records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        if not records:
            return "planner vs run: no metrics were logged"
        # the median over logged windows: the first (warm-up) and the instrumented one are outliers
        measured = {"step_time_s": statistics.median(r["step_time_s"] for r in records),
                    # positions (what the planner counts), not the loss's targets (an SFT run's responses)
                    "tokens_per_s": statistics.median(r.get("positions_per_s", r["tokens_per_s"]) for r in records)}
        counted = [r for r in records if "comm_bytes_per_step" in r]
        if counted:
            measured["comm_bytes_per_step"] = counted[-1]["comm_bytes_per_step"]
        self.record["measured"] = measured
        self._write(view.run_dir)
        pred = self.record["predicted"]
        parts = []
        if "step_time_s" in pred:
            parts.append(f"step {pred['step_time_s']:.3g} s predicted / {measured['step_time_s']:.3g} s measured")
        if "comm_bytes_per_step" in measured:
            parts.append(f"collective bytes {pred['comm_bytes_per_step']:,} / {measured['comm_bytes_per_step']:,}")
        return "planner vs run: " + ("; ".join(parts) if parts else "nothing comparable was measured")

    def _write(self, run_dir: Path) -> None:
        atomic_write_text(Path(run_dir) / FILE, json.dumps(self.record, indent=1))
