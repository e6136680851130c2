"""Chinchilla approach 2: IsoFLOP profiles.

Rows are grouped by compute: by their ``budget`` (the nominal C that ``meshlm sweep`` writes) when every row has
one, else by ``flops`` (sorted, a new group where the next row is more than 10% above the group's first). For
each group with at least 3 distinct sizes, loss is fitted with a parabola in log N; its vertex is N_opt(C), and
D_opt(C) = C / (k_C · N_opt) with k_C the group's FLOPs per parameter-token. A vertex outside the sizes the group
sampled is an extrapolation: such a group is reported but not used. Then log N_opt and log D_opt are regressed
on log C: N_opt ∝ C^a, D_opt ∝ C^b (Hoffmann et al.: a ≈ b ≈ 0.5). The minimum loss per group is regressed the
same way (a pure power law in C, no irreducible term: fine near the sampled budgets, optimistic far beyond them).

Intervals: a parametric bootstrap. Every loss is multiplied by exp(σ·ε), ε ~ N(0, 1), the whole procedure is
repeated, and the 2.5th/97.5th percentiles are reported. σ is given by the caller (``meshlm scaling fit`` passes
approach 3's RMS log residual over the same rows) or estimated from the parabolas' own residuals. Resampling
points inside a group was tried first and is useless for the usual 3-5 sizes per group: a resample with fewer
than 3 distinct sizes has no parabola, and the ones left are the original points again (zero-width intervals).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from meshlm.scaling.fit import percentile_ci
from meshlm.scaling.rows import Rows

GROUP_TOLERANCE = 1.10  # rows within 10% of a group's first FLOPs belong to it (when no budget is given)
MIN_SIZES = 3  # a parabola needs 3 distinct sizes


def group_rows(rows: Rows) -> list[np.ndarray]:
    """Index arrays of the IsoFLOP groups (any size); see the module docstring for the rule."""
    if np.all(np.isfinite(rows.budget)):
        return [np.flatnonzero(rows.budget == b) for b in np.unique(rows.budget)]
    order = np.argsort(rows.flops, kind="stable")
    groups, current = [], [order[0]]
    for i in order[1:]:
        if rows.flops[i] > rows.flops[current[0]] * GROUP_TOLERANCE:
            groups.append(np.array(current))
            current = []
        current.append(i)
    groups.append(np.array(current))
    return groups


@dataclass
class Vertex:
    flops: float
    params: float
    tokens: float
    loss: float
    inside: bool  # the vertex lies within the sizes the group sampled
    convex: bool


def vertex(params: np.ndarray, tokens: np.ndarray, flops: np.ndarray, loss: np.ndarray,
           budget: float) -> Vertex | None:
    """The parabola's minimum for one group; None when it has fewer than 3 distinct sizes."""
    x = np.log(params)
    if len(np.unique(x)) < MIN_SIZES:
        return None
    c2, c1, c0 = np.polyfit(x, loss, 2)
    k = float(np.median(flops / (params * tokens)))
    if c2 <= 0:  # concave or flat: no minimum
        return Vertex(budget, math.nan, math.nan, math.nan, False, False)
    x_opt = -c1 / (2 * c2)
    n_opt = math.exp(x_opt)
    inside = bool(x.min() <= x_opt <= x.max())
    return Vertex(budget, n_opt, budget / (k * n_opt), float(c0 + c1 * x_opt + c2 * x_opt**2), inside, True)


def _power_law(c: np.ndarray, v: np.ndarray) -> tuple[float, float]:
    """(exponent, log prefactor) of v = e^i · C^e by least squares in log-log."""
    slope, intercept = np.polyfit(np.log(c), np.log(v), 1)
    return float(slope), float(intercept)


@dataclass
class Approach2:
    groups: list[dict]
    a: float
    b: float
    coef: dict[str, tuple[float, float]]  # params / tokens / loss: (exponent, log prefactor)
    boot: list[dict[str, tuple[float, float]]] = field(default_factory=list)
    noise: float = 0.0  # σ of the parametric bootstrap (log loss)

    def ci95(self) -> dict[str, list[float]]:
        return {"a": percentile_ci([b["params"][0] for b in self.boot]),
                "b": percentile_ci([b["tokens"][0] for b in self.boot])}

    def optimal(self, flops: float) -> dict:
        def at(coef: dict, key: str) -> float:
            exponent, log_pre = coef[key]
            return math.exp(log_pre + exponent * math.log(flops))

        out = {"flops": flops, **{key: at(self.coef, key) for key in ("params", "tokens", "loss")}}
        out["ci95"] = {key: percentile_ci([at(b, key) for b in self.boot]) for key in ("params", "tokens", "loss")}
        return out

    def as_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "ci95": self.ci95(), "loss_exponent": self.coef["loss"][0],
                "noise_sigma": self.noise, "groups": self.groups}


def _frontier(vertices: list[Vertex]) -> dict[str, tuple[float, float]] | None:
    usable = [v for v in vertices if v is not None and v.inside]
    if len(usable) < 2 or len({v.flops for v in usable}) < 2:
        return None
    c = np.array([v.flops for v in usable])
    return {key: _power_law(c, np.array([getattr(v, key) for v in usable])) for key in ("params", "tokens", "loss")}


def _budget_of(rows: Rows, idx: np.ndarray) -> float:
    return float(rows.budget[idx[0]]) if np.isfinite(rows.budget[idx[0]]) else float(np.median(rows.flops[idx]))


def _parabola_noise(rows: Rows, groups: list[np.ndarray]) -> float:
    """Pooled RMS of the parabolas' log residuals (dof-corrected); 0 when every group has exactly 3 sizes."""
    squares, dof = 0.0, 0
    for g in groups:
        x, y = np.log(rows.params[g]), np.log(rows.loss[g])
        squares += float(np.sum((np.polyval(np.polyfit(x, y, 2), x) - y) ** 2))
        dof += len(g) - 3
    return math.sqrt(squares / dof) if dof > 0 else 0.0


def fit_approach2(rows: Rows, *, bootstrap: int = 200, seed: int = 0,
                  noise: float | None = None) -> tuple[Approach2 | None, str]:
    """(fit, "") or (None, why not): needs at least 2 groups of >= 3 sizes whose vertices lie inside them.
    ``noise``: σ of the parametric bootstrap in log loss (None: from the parabolas' residuals)."""
    groups = [g for g in group_rows(rows) if len(np.unique(rows.params[g])) >= MIN_SIZES]
    if len(groups) < 2:
        return None, (f"approach 2 needs IsoFLOP groups: at least 2 compute budgets with >= {MIN_SIZES} model "
                      f"sizes each (found {len(groups)})")
    budgets = [_budget_of(rows, g) for g in groups]
    vertices = [vertex(rows.params[g], rows.tokens[g], rows.flops[g], rows.loss[g], c) for g, c in zip(groups, budgets)]
    coef = _frontier(vertices)
    report = [{"flops": v.flops, "num_points": len(g), "params_opt": v.params, "tokens_opt": v.tokens,
               "loss_min": v.loss, "used": v.inside,
               "note": "" if v.inside else ("no minimum (the curve is not convex)" if not v.convex else
                                            "minimum outside the sampled sizes (extrapolated; not used)")}
              for g, v in zip(groups, vertices)]
    if coef is None:
        return None, ("approach 2: fewer than 2 IsoFLOP groups have their minimum inside the sampled sizes; "
                      "widen the size range around the optimum")
    sigma = _parabola_noise(rows, groups) if noise is None else float(noise)
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(bootstrap if sigma > 0 else 0):
        loss = rows.loss * np.exp(sigma * rng.standard_normal(len(rows)))
        vs = [vertex(rows.params[g], rows.tokens[g], rows.flops[g], loss[g], c) for g, c in zip(groups, budgets)]
        fitted = _frontier(vs)
        if fitted is not None:
            boot.append(fitted)
    return Approach2(report, coef["params"][0], coef["tokens"][0], coef, boot, sigma), ""
