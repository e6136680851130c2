"""Chinchilla approach 3: L(N, D) = E + A/N^α + B/D^β, fitted as Hoffmann et al. (2022) and the Epoch
replication (Besiroglu et al. 2024) do.

Parameters θ = (a, b, e, α, β) with A = eᵃ, B = eᵇ, E = eᵉ, so log L̂ = LSE(a − α·log N, b − β·log D, e). The
objective is Σ Huber_δ(log L̂ − log L) with δ = 1e-3, minimised by L-BFGS (no bounds, analytic gradient; the
batched numpy L-BFGS of meshlm/scaling/lbfgs.py, checked against scipy's L-BFGS-B in the tests). Starting points:
the published grid α, β ∈ {0, 0.5, …, 2}, e ∈ {−1, −0.5, …, 1}, a, b ∈ {0, 5, …, 25} (4,500 points). By default
L-BFGS runs from every one of them, as the papers do, and the lowest optimum wins; ``starts=K`` first ranks the
grid by its objective (vectorised, cheap) and runs from the K best only (the tests use it to stay fast).

Intervals: a percentile bootstrap. Rows are resampled with replacement ``bootstrap`` times; each resample is refit
from the full-data optimum plus its own best few grid points; the 2.5th and 97.5th percentiles of each quantity
(the parameters, and whatever is derived from them: the compute-optimal N, D, loss) are the 95% interval.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from meshlm.scaling.lbfgs import minimize_batched
from meshlm.scaling.rows import Rows

HUBER_DELTA = 1e-3
KEYS = ("E", "A", "B", "alpha", "beta")


def init_grid() -> np.ndarray:
    """(4500, 5) starting points (a, b, e, alpha, beta) of Hoffmann et al. / Besiroglu et al."""
    alphas = np.arange(0.0, 2.01, 0.5)
    es = np.arange(-1.0, 1.01, 0.5)
    ab = np.arange(0.0, 25.1, 5.0)
    return np.array([(a, b, e, al, be) for a, b, e, al, be in itertools.product(ab, ab, es, alphas, alphas)])


@dataclass(frozen=True)
class Law:
    """One fitted L(N, D)."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float

    @classmethod
    def from_theta(cls, theta: np.ndarray) -> Law:
        a, b, e, alpha, beta = (float(t) for t in theta)
        with np.errstate(over="ignore"):  # a diverged (bootstrap) fit: inf, counted by Approach3.degenerate
            return cls(*(float(np.exp(v)) for v in (e, a, b)), alpha, beta)

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in (self.E, self.A, self.B, self.alpha, self.beta))

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in KEYS}

    def loss(self, params, tokens):
        with np.errstate(all="ignore"):  # degenerate bootstrap fits give inf/nan, left out of the intervals
            return self.E + self.A / np.power(params, self.alpha) + self.B / np.power(tokens, self.beta)

    def optimal(self, flops: float, k: float = 6.0) -> dict[str, float]:
        """Compute-optimal N, D and loss for a budget C = k·N·D (Hoffmann's closed form with 6 → k):
        N_opt = G·(C/k)^(β/(α+β)), D_opt = (C/k)/N_opt, G = (αA/(βB))^(1/(α+β))."""
        s = self.alpha + self.beta
        if self.alpha <= 0 or self.beta <= 0:  # no interior optimum: a degenerate (e.g. bootstrap) fit
            return {"flops": flops, "params": math.nan, "tokens": math.nan, "loss": math.nan}
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1 / s)
        params = g * (flops / k) ** (self.beta / s)
        tokens = flops / (k * params)
        return {"flops": flops, "params": params, "tokens": tokens, "loss": float(self.loss(params, tokens))}


class _Problems:
    """One or more data sets (e.g. bootstrap resamples) of equal size; batch row i fits problem ``owner[i]``.
    log N and log D are centred (a ← a − α·mean log N, b ← b − β·mean log D) so that a and α, b and β are not
    nearly collinear: L-BFGS needs several times fewer iterations."""

    def __init__(self, params: np.ndarray, tokens: np.ndarray, loss: np.ndarray, delta: float) -> None:
        self.x, self.y = np.log(np.atleast_2d(params)), np.log(np.atleast_2d(tokens))  # (R, n)
        self.log_loss, self.delta = np.log(np.atleast_2d(loss)), delta
        self.x0, self.y0 = float(self.x.mean()), float(self.y.mean())
        self.owner = np.zeros(0, dtype=np.int64)

    def centred(self, theta: np.ndarray) -> np.ndarray:
        t = np.array(theta, dtype=np.float64, ndmin=2)
        t[:, 0] -= t[:, 3] * self.x0
        t[:, 1] -= t[:, 4] * self.y0
        return t

    def uncentred(self, theta: np.ndarray) -> np.ndarray:
        t = np.array(theta, dtype=np.float64, ndmin=2)
        t[:, 0] += t[:, 3] * self.x0
        t[:, 1] += t[:, 4] * self.y0
        return t

    def __call__(self, theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Σ Huber(log L̂ − log L) / δ per row and its gradient in the centred θ."""
        p = self.owner[rows]
        x, y, log_loss = self.x[p] - self.x0, self.y[p] - self.y0, self.log_loss[p]  # (B, n)
        a, b, e, alpha, beta = (theta[:, i:i + 1] for i in range(5))
        t1, t2 = a - alpha * x, b - beta * y
        top = np.maximum(np.maximum(t1, t2), e)
        w1, w2, w3 = np.exp(t1 - top), np.exp(t2 - top), np.exp(e - top)
        total = w1 + w2 + w3
        r = top + np.log(total) - log_loss  # (B, n) log L̂ − log L
        small = np.abs(r) <= self.delta
        value = np.where(small, 0.5 * r * r / self.delta, np.abs(r) - 0.5 * self.delta).sum(axis=1)
        dr = np.where(small, r / self.delta, np.sign(r)) / total  # d value / d pred, over Σ exp
        wa, wb, we = w1 * dr, w2 * dr, w3 * dr
        grad = np.stack([wa.sum(1), wb.sum(1), we.sum(1), -(wa * x).sum(1), -(wb * y).sum(1)], axis=1)
        return value, grad

    def grid_values(self, grid: np.ndarray, problem: int) -> np.ndarray:
        """The objective at every grid point (uncentred θ) for one problem: (G,)."""
        x, y, log_loss = self.x[problem], self.y[problem], self.log_loss[problem]
        a, b, e, alpha, beta = (grid[:, i:i + 1] for i in range(5))
        r = np.abs(np.logaddexp(np.logaddexp(a - alpha * x, b - beta * y), e) - log_loss)  # (G, n)
        return np.where(r <= self.delta, 0.5 * r * r / self.delta, r - 0.5 * self.delta).sum(axis=1)

    def solve(self, starts: list[np.ndarray]) -> list[np.ndarray]:
        """``starts[r]``: (S_r, 5) uncentred starting points for problem r; the best optimum of each problem."""
        self.owner = np.concatenate([np.full(len(s), r) for r, s in enumerate(starts)])
        theta, value = minimize_batched(self, self.centred(np.concatenate(starts)))
        theta = self.uncentred(theta)
        value = np.where(np.isfinite(value) & np.all(np.isfinite(theta), axis=1), value, np.inf)
        return [theta[self.owner == r][np.argmin(value[self.owner == r])] for r in range(len(starts))]


def best_starts(problems: _Problems, problem: int, grid: np.ndarray, starts: int) -> np.ndarray:
    """The ``starts`` grid points with the lowest objective (all of them when ``starts`` is 0)."""
    if starts <= 0 or starts >= len(grid):
        return grid
    return grid[np.argsort(problems.grid_values(grid, problem), kind="stable")[:starts]]


def fit_theta(params: np.ndarray, tokens: np.ndarray, loss: np.ndarray, *, starts: int = 0,
              delta: float = HUBER_DELTA) -> np.ndarray:
    """θ = (a, b, e, α, β) minimising the Huber objective: L-BFGS from every grid point (``starts`` = 0) or from
    the ``starts`` best grid points; the lowest optimum."""
    problems = _Problems(params, tokens, loss, delta)
    return problems.solve([best_starts(problems, 0, init_grid(), starts)])[0]


def bootstrap_thetas(params: np.ndarray, tokens: np.ndarray, loss: np.ndarray, theta: np.ndarray, *,
                     resamples: int, starts: int, seed: int, delta: float = HUBER_DELTA) -> list[np.ndarray]:
    """Refit ``resamples`` resamples (rows drawn with replacement), each from ``theta`` and its own ``starts``
    best grid points, all in one batch."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(params), (resamples, len(params)))  # (R, n)
    problems = _Problems(params[idx], tokens[idx], loss[idx], delta)
    grid = init_grid()
    starts_per = [np.vstack([theta[None], best_starts(problems, r, grid, starts)]) for r in range(resamples)]
    return problems.solve(starts_per)


@dataclass
class Approach3:
    law: Law
    theta: np.ndarray
    boot: list[Law]  # one law per bootstrap resample
    k: float  # FLOPs per parameter-token of the rows (C = k·N·D)

    def ci95(self) -> dict[str, list[float]]:
        return {key: percentile_ci([getattr(b, key) for b in self.boot]) for key in KEYS}

    @property
    def degenerate(self) -> int:
        """Bootstrap fits that diverged (a parameter overflowed) or have no interior optimum (α or β ≤ 0); the
        intervals are taken over the others, so many of these mean the intervals understate the uncertainty."""
        return sum(1 for b in self.boot if not b.finite or b.alpha <= 0 or b.beta <= 0)

    def optimal(self, flops: float) -> dict:
        """Compute-optimal allocation for ``flops`` with bootstrap intervals."""
        point = self.law.optimal(flops, self.k)
        boots = [b.optimal(flops, self.k) for b in self.boot]
        point["ci95"] = {key: percentile_ci([b[key] for b in boots]) for key in ("params", "tokens", "loss")}
        return point

    def predict(self, params: float, tokens: float) -> dict:
        """Predicted loss of one (N, D) with its bootstrap interval."""
        return {"predicted": float(self.law.loss(params, tokens)),
                "predicted_ci95": percentile_ci([float(b.loss(params, tokens)) for b in self.boot])}


def percentile_ci(values: list[float]) -> list[float]:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return [math.nan, math.nan]
    lo, hi = np.percentile(v, [2.5, 97.5])
    return [float(lo), float(hi)]


def fit_approach3(rows: Rows, *, bootstrap: int = 200, starts: int = 0, boot_starts: int = 8,
                  seed: int = 0) -> Approach3:
    """Fit L(N, D) to ``rows`` and bootstrap it (``bootstrap`` resamples; 0 = no intervals)."""
    theta = fit_theta(rows.params, rows.tokens, rows.loss, starts=starts)
    boot = bootstrap_thetas(rows.params, rows.tokens, rows.loss, theta, resamples=bootstrap, starts=boot_starts,
                            seed=seed) if bootstrap else []
    return Approach3(Law.from_theta(theta), theta, [Law.from_theta(t) for t in boot], rows.flops_per_param_token)
