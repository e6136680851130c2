"""``meshlm scaling fit``: both approaches, the compute-optimal allocation, residuals and held-out checks, as one
JSON-ready dict (the ``--json`` document) plus a text rendering."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from meshlm.errors import DataError
from meshlm.scaling.fit import HUBER_DELTA, Approach3, fit_approach3
from meshlm.scaling.isoflop import Approach2, fit_approach2
from meshlm.scaling.rows import Rows, check_fittable


@dataclass
class FitResult:
    rows: Rows  # every row read
    fitted: np.ndarray  # (n,) bool: used by the fit (False: held out)
    approach3: Approach3
    approach2: Approach2 | None
    document: dict


def residuals(a3: Approach3, rows: Rows) -> dict:
    """log L̂ − log L per fitted row, with their RMS and maximum."""
    predicted = a3.law.loss(rows.params, rows.tokens)
    r = np.log(predicted) - np.log(rows.loss)
    table = [{"name": n, "params": float(p), "tokens": float(t), "loss": float(l), "predicted": float(q),
              "log_residual": float(e)}
             for n, p, t, l, q, e in zip(rows.names, rows.params, rows.tokens, rows.loss, predicted, r)]
    return {"rms_log": float(np.sqrt(np.mean(r * r))), "max_abs_log": float(np.max(np.abs(r))), "rows": table}


def holdout_check(a3: Approach3, rows: Rows) -> list[dict]:
    """Predicted vs measured loss of rows the fit did not see."""
    out = []
    for i, name in enumerate(rows.names):
        pred = a3.predict(rows.params[i], rows.tokens[i])
        lo, hi = pred["predicted_ci95"]
        out.append({"name": name, "params": float(rows.params[i]), "tokens": float(rows.tokens[i]),
                    "flops": float(rows.flops[i]), "loss": float(rows.loss[i]), **pred,
                    "rel_error": (pred["predicted"] - float(rows.loss[i])) / float(rows.loss[i]),
                    "inside_ci95": bool(lo <= rows.loss[i] <= hi)})
    return out


def fit_scaling(rows: Rows, *, budget: float | None = None, holdout: list[str] = (), bootstrap: int = 200,
                starts: int = 0, seed: int = 0) -> FitResult:
    """Fit everything the rows allow; ``holdout`` names rows left out of both fits and predicted instead."""
    if budget is not None and not (budget > 0 and math.isfinite(budget)):
        raise DataError(f"--budget must be a positive number of FLOPs, got {budget:g}")
    if bootstrap < 0 or starts < 0:
        raise DataError("--bootstrap and --starts must be >= 0")
    fitted = np.ones(len(rows), dtype=bool)
    for name in holdout:
        fitted[rows.index(name)] = False
    train = rows.subset(fitted)
    check_fittable(train)
    a3 = fit_approach3(train, bootstrap=bootstrap, starts=starts, seed=seed)
    # approach 2's intervals: a parametric bootstrap with approach 3's residual scale (isoflop.py says why)
    res = residuals(a3, train)
    a2, why_not = fit_approach2(train, bootstrap=bootstrap, seed=seed, noise=res["rms_log"])
    notes = [why_not] if why_not else []
    if not (a3.law.alpha > 0 and a3.law.beta > 0):
        notes.append(f"the fit has alpha = {a3.law.alpha:.3g}, beta = {a3.law.beta:.3g}: loss does not fall with "
                     "both size and tokens in these runs, so there is no compute-optimal allocation (NaN); runs "
                     "far from ~20 tokens per parameter, or too few of them, do this")
    if a3.degenerate:
        notes.append(f"{a3.degenerate} of {bootstrap} bootstrap fits diverged or lost the optimum (alpha or beta <= "
                     "0); the intervals leave them out and so understate the uncertainty: add runs")
    if not rows.flops_counted:
        notes.append("some rows have no flops: C = 6·N·D was used for them")
    ci = a3.ci95()
    doc = {
        "input": rows.source,
        "num_points": int(fitted.sum()),
        "huber_delta": HUBER_DELTA,
        "bootstrap": bootstrap,
        "bootstrap_degenerate": a3.degenerate,
        "flops_per_param_token": a3.k,
        "fit": a3.law.as_dict(),
        "ci95": ci,
        "optimal": a3.optimal(budget) if budget else None,
        "isoflop": None,
        "residuals": res,
        "holdout": holdout_check(a3, rows.subset(~fitted)) if holdout else None,
        "notes": notes,
    }
    if a2 is not None:
        doc["isoflop"] = {**a2.as_dict(), "optimal": a2.optimal(budget) if budget else None}
    return FitResult(rows, fitted, a3, a2, doc)


def json_safe(value):
    """The document with NaN/inf floats as null (strict JSON has no NaN): a degenerate fit's optimum, say."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _ci(pair: list[float], fmt: str = "{:.3g}") -> str:
    return "[" + ", ".join(fmt.format(v) for v in pair) + "]"


def render_text(doc: dict) -> str:
    """The report for a terminal."""
    f, ci = doc["fit"], doc["ci95"]
    lines = [f"{doc['num_points']} runs from {doc['input']}; C = {doc['flops_per_param_token']:.3g}·N·D "
             f"(the rows' FLOPs per parameter-token); {doc['bootstrap']} bootstrap resamples",
             "approach 3: L(N, D) = E + A/N^alpha + B/D^beta (Huber on log loss, L-BFGS from a grid)"]
    for key in ("E", "A", "B", "alpha", "beta"):
        lines.append(f"  {key:>5} = {f[key]:<10.4g} 95% CI {_ci(ci[key])}")
    res = doc["residuals"]
    lines.append(f"  residuals (log): rms {res['rms_log']:.4f}, max |r| {res['max_abs_log']:.4f}")
    iso = doc["isoflop"]
    if iso:
        lines.append(f"approach 2 (IsoFLOP): N_opt ∝ C^{iso['a']:.3f} {_ci(iso['ci95']['a'], '{:.3f}')}, "
                     f"D_opt ∝ C^{iso['b']:.3f} {_ci(iso['ci95']['b'], '{:.3f}')} (intervals: losses perturbed "
                     f"by {iso['noise_sigma']:.3f} in log)")
        for g in iso["groups"]:
            state = "" if g["used"] else f"  ({g['note']})"
            lines.append(f"  C = {g['flops']:.3g}: N_opt {g['params_opt']:.3g}, D_opt {g['tokens_opt']:.3g}, "
                         f"min loss {g['loss_min']:.4f}, {g['num_points']} runs{state}")
    for note in doc["notes"]:
        lines.append(f"note: {note}")
    for name, opt in (("approach 3", doc["optimal"]), ("approach 2", iso and iso.get("optimal"))):
        if opt:
            c = opt["ci95"]
            lines.append(f"compute-optimal at C = {opt['flops']:.3g} ({name}): N = {opt['params']:.3g} "
                         f"{_ci(c['params'])}, D = {opt['tokens']:.3g} {_ci(c['tokens'])}, loss = "
                         f"{opt['loss']:.4f} {_ci(c['loss'], '{:.4f}')}")
    for h in doc["holdout"] or []:
        lines.append(f"held out {h['name']}: measured {h['loss']:.4f}, predicted {h['predicted']:.4f} "
                     f"{_ci(h['predicted_ci95'], '{:.4f}')} ({100 * h['rel_error']:+.2f}%)")
    return "\n".join(lines)
