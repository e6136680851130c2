"""L-BFGS for many small problems at once, in numpy.

The scaling-law fit runs L-BFGS from 4,500 starting points, and again for every bootstrap resample. One scipy
``minimize`` call per start costs milliseconds of Python overhead per iteration (minutes for the grid on these
CPUs); here every start is one row of a (B, P) array and each iteration is a handful of vectorised operations.

Each row has its own history (two-loop recursion), its own backtracking line search (Armijo, halving), and stops on
its own when the objective stops improving (relative ``ftol``) or the gradient is small (``gtol``). A row whose
direction is not a descent direction drops its history and follows the negative gradient. tests/test_scaling.py
checks the optimum against scipy's L-BFGS-B from the same starts.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

Objective = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]  # (theta, rows) -> (f, grad)


def minimize_batched(fun: Objective, theta0: np.ndarray, *, max_iter: int = 500, history: int = 10,
                     ftol: float = 1e-10, gtol: float = 1e-9, max_halvings: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Minimise ``fun`` from every row of ``theta0`` (B, P); returns (theta (B, P), f (B,)).

    ``fun(theta, rows)`` evaluates the rows ``rows`` (indices into the batch) at ``theta`` (len(rows), P) and
    returns their values (len(rows),) and gradients (len(rows), P)."""
    theta = np.array(theta0, dtype=np.float64)
    num, dim = theta.shape
    every = np.arange(num)
    f, g = fun(theta, every)
    s_hist = np.zeros((history, num, dim))
    y_hist = np.zeros((history, num, dim))
    rho = np.zeros((history, num))  # 0 marks an empty slot
    active = np.isfinite(f) & np.all(np.isfinite(g), axis=1)
    for it in range(max_iter):
        rows = np.flatnonzero(active)
        if not len(rows):
            break
        d = _direction(g[rows], s_hist[:, rows], y_hist[:, rows], rho[:, rows], it % history)
        slope = np.einsum("bp,bp->b", d, g[rows])
        bad = ~(slope < 0)  # not a descent direction: forget the history, follow the gradient
        if bad.any():
            rho[:, rows[bad]] = 0.0
            d[bad] = -g[rows[bad]]
            slope[bad] = -np.einsum("bp,bp->b", g[rows[bad]], g[rows[bad]])
        no_hist = ~rho[:, rows].any(axis=0)  # first step: a unit-length step along -g
        scale = np.where(no_hist, 1.0 / np.maximum(np.linalg.norm(d, axis=1), 1.0), 1.0)
        step, f_new, g_new = _line_search(fun, theta[rows], f[rows], d * scale[:, None], slope * scale, rows,
                                          max_halvings)
        moved = np.isfinite(f_new)
        s = step[:, None] * (d * scale[:, None])
        y = g_new - g[rows]
        sy = np.einsum("bp,bp->b", s, y)
        slot = it % history
        keep = moved & (sy > 1e-16)
        s_hist[slot, rows] = np.where(keep[:, None], s, 0.0)
        y_hist[slot, rows] = np.where(keep[:, None], y, 0.0)
        rho[slot, rows] = np.where(keep, 1.0 / np.where(keep, sy, 1.0), 0.0)
        f_old = f[rows]
        theta[rows[moved]] += s[moved]
        f[rows[moved]], g[rows[moved]] = f_new[moved], g_new[moved]
        small_change = np.abs(f_old - f[rows]) <= ftol * np.maximum(np.maximum(np.abs(f_old), np.abs(f[rows])), 1e-30)
        converged = ~moved | small_change | (np.abs(g[rows]).max(axis=1) <= gtol)
        active[rows[converged]] = False
    return theta, f


def _direction(g: np.ndarray, s: np.ndarray, y: np.ndarray, rho: np.ndarray, next_slot: int) -> np.ndarray:
    """-H·g by the two-loop recursion, newest pair first; empty slots (rho 0) contribute nothing."""
    history = len(rho)
    order = [(next_slot - 1 - i) % history for i in range(history)]  # newest → oldest
    q = g.copy()
    alphas = {}
    for i in order:
        alphas[i] = rho[i] * np.einsum("bp,bp->b", s[i], q)
        q -= alphas[i][:, None] * y[i]
    newest = order[0]
    yy = np.einsum("bp,bp->b", y[newest], y[newest])
    gamma = np.where(rho[newest] > 0, 1.0 / np.where(rho[newest] > 0, rho[newest] * yy, 1.0), 1.0)
    r = gamma[:, None] * q
    for i in reversed(order):
        beta = rho[i] * np.einsum("bp,bp->b", y[i], r)
        r += s[i] * (alphas[i] - beta)[:, None]
    return -r


def _line_search(fun: Objective, theta: np.ndarray, f: np.ndarray, d: np.ndarray, slope: np.ndarray,
                 rows: np.ndarray, max_halvings: int, c1: float = 1e-4,
                 batch_rows: int = 2048) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Backtracking from step 1 until f(θ + t·d) ≤ f + c1·t·slope, per row; the largest t = 2^-j that passes.
    Step 1 is tried first (after a good quasi-Newton update it usually passes); after that, when few rows are
    left, several halvings are tried in one call of ``fun`` (about ``batch_rows`` rows per call): for a handful of
    rows the call, not the arithmetic, is what costs.
    Rows that never pass get f_new = NaN (converged as far as this search can tell)."""
    num = len(rows)
    step = np.zeros(num)
    f_new = np.full(num, np.nan)
    g_new = np.zeros_like(theta)
    todo = np.arange(num)
    first = 0
    while first < max_halvings and len(todo):
        per_call = 1 if first == 0 else int(np.clip(batch_rows // len(todo), 1, 8))
        ts = 0.5 ** np.arange(first, min(first + per_call, max_halvings))  # (J,)
        first += len(ts)
        J = len(ts)
        trial = (theta[todo, None, :] + ts[None, :, None] * d[todo, None, :]).reshape(-1, theta.shape[1])
        ft, gt = fun(trial, np.repeat(rows[todo], J))
        ft, gt = ft.reshape(len(todo), J), gt.reshape(len(todo), J, -1)
        ok = np.isfinite(ft) & (ft <= f[todo, None] + c1 * ts[None, :] * slope[todo, None])  # (n, J)
        found = ok.any(axis=1)
        j = np.argmax(ok, axis=1)  # the first (largest) passing step
        hit = todo[found]
        step[hit] = ts[j[found]]
        f_new[hit] = ft[found, j[found]]
        g_new[hit] = gt[found, j[found]]
        todo = todo[~found]
    return step, f_new, g_new
