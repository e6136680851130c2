"""Compute-optimal model size and tokens for a FLOP budget (Chinchilla), and training time in days.

L(N, D) = E + A/N^α + B/D^β with C = 6·N·D. Minimising L under the budget gives
N_opt = G·(C/6)^(β/(α+β)), D_opt = (C/6)/N_opt, G = (α·A / (β·B))^(1/(α+β)).
Constants: Hoffmann et al. 2022 (E 1.69, A 406.4, B 410.7, α 0.34, β 0.28) and the Besiroglu et al. 2024
replication (E 1.82, A 482, B 2085, α 0.348, β 0.366). The rule of thumb is ~20 tokens per parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshlm.errors import ConfigError


@dataclass(frozen=True)
class ScalingFit:
    name: str
    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def loss(self, params: float, tokens: float) -> float:
        return self.E + self.A / params**self.alpha + self.B / tokens**self.beta


FITS = {
    "hoffmann": ScalingFit("Hoffmann et al. 2022", 1.69, 406.4, 410.7, 0.34, 0.28),
    "besiroglu": ScalingFit("Besiroglu et al. 2024", 1.82, 482.0, 2085.0, 0.348, 0.366),
}
TOKENS_PER_PARAM = 20.0


def compute_optimal(flops: float, fit: str = "hoffmann") -> dict[str, float]:
    """Parameters, tokens and predicted loss that minimise L for a training budget of ``flops``."""
    if flops <= 0:
        raise ConfigError(f"--budget-flops must be positive, got {flops:g}")
    f = FITS[fit]
    g = (f.alpha * f.A / (f.beta * f.B)) ** (1 / (f.alpha + f.beta))
    params = g * (flops / 6) ** (f.beta / (f.alpha + f.beta))
    tokens = flops / (6 * params)
    return {"params": params, "tokens": tokens, "tokens_per_param": tokens / params,
            "loss": f.loss(params, tokens), "fit": f.name}


def rule_of_thumb(flops: float) -> dict[str, float]:
    """20 tokens per parameter: C = 6·N·20N."""
    params = (flops / (6 * TOKENS_PER_PARAM)) ** 0.5
    return {"params": params, "tokens": TOKENS_PER_PARAM * params}


def training_days(tokens: float, tokens_per_s: float) -> float:
    return tokens / tokens_per_s / 86400 if tokens_per_s > 0 else float("inf")
