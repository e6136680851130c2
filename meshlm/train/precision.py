"""Precision modes: fp32, bf16 autocast, fp16 autocast with dynamic loss scaling.

Parameters (master weights) and optimizer state always stay fp32; only the forward/backward compute runs in
low precision under autocast.
"""

from __future__ import annotations

import contextlib
import math

import torch

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device_type: str) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=_DTYPES[precision])


class DynamicLossScaler:
    """Scale the loss so fp16 gradients do not underflow; back off and skip the step on inf/NaN.

    The check uses the global gradient norm the trainer computes anyway (which already spans every shard and
    rank), so it needs no collective of its own.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 1000, min_scale: float = 1.0) -> None:
        self.scale = init_scale
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.min_scale = min_scale
        self.good_steps = 0
        self.skipped_steps = 0

    def update(self, grad_norm: torch.Tensor | float) -> bool:
        """Record one step's (unscaled) grad norm; return True when the optimizer step must be skipped.

        Deciding to skip needs the norm's finiteness on the host: this is the trainer's one host
        synchronisation per optimizer step under fp16 (a one-element read after the backward; never per
        micro-batch). fp32 and bf16 runs have no scaler and so no such read.
        """
        if not math.isfinite(float(grad_norm)):
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.good_steps = 0
            self.skipped_steps += 1
            return True
        self.good_steps += 1
        if self.good_steps % self.growth_interval == 0:
            self.scale *= self.growth_factor
        return False

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
        self.skipped_steps = int(state["skipped_steps"])
