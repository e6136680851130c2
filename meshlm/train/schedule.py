"""Learning-rate schedules as pure functions of the step, so resuming needs no scheduler state but the step."""

from __future__ import annotations

import math

from meshlm.config.schema import ScheduleConfig


def lr_at(step: int, peak_lr: float, total_steps: int, cfg: ScheduleConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based) of ``total_steps``.

    Warmup rises linearly to ``peak_lr`` over ``cfg.warmup_steps`` (the first step uses peak/warmup, never 0).
    ``cosine`` then decays to ``min_lr_ratio * peak`` at the last step; ``wsd`` (warmup-stable-decay) holds the
    peak and decays linearly over the final ``decay_fraction`` of the steps; ``constant`` holds the peak.
    """
    min_lr = peak_lr * cfg.min_lr_ratio
    warmup = min(cfg.warmup_steps, total_steps)
    if step < warmup:
        return peak_lr * (step + 1) / warmup
    if cfg.name == "constant":
        return peak_lr
    remaining = max(total_steps - warmup - 1, 1)
    if cfg.name == "cosine":
        progress = min((step - warmup) / remaining, 1.0)
        return min_lr + 0.5 * (peak_lr - min_lr) * (1 + math.cos(math.pi * progress))
    assert cfg.name == "wsd", cfg.name
    decay_steps = max(int(round(cfg.decay_fraction * (total_steps - warmup))), 1)
    decay_start = total_steps - decay_steps
    if step < decay_start:
        return peak_lr
    progress = min((step - decay_start + 1) / decay_steps, 1.0)
    return peak_lr + (min_lr - peak_lr) * progress
