"""The rows a scaling fit reads: one finished run each, from a sweep directory or a JSONL file.

A row needs ``params``, ``tokens`` and ``loss`` (all positive, finite numbers); ``flops`` is optional (6·N·D
when absent) and ``name`` defaults to ``row<line>``. ``budget`` (the nominal compute of an IsoFLOP group, written
by ``meshlm sweep``) groups rows for approach 2. Every mistake names the file, the line and the column.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from meshlm.errors import DataError

POINTS_FILE = "points.jsonl"
REQUIRED = ("params", "tokens", "loss")


@dataclass
class Rows:
    """Columns of the rows as float64 arrays (N, D, C, loss), in file order."""

    names: list[str]
    params: np.ndarray
    tokens: np.ndarray
    flops: np.ndarray
    loss: np.ndarray
    budget: np.ndarray  # nominal IsoFLOP budget per row; NaN when the row has none
    source: str = ""
    flops_counted: bool = False  # True when every row carried its own flops (else some are 6·N·D)
    extra: list[dict] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.names)

    def subset(self, keep: np.ndarray) -> Rows:
        idx = np.flatnonzero(keep)
        return Rows([self.names[i] for i in idx], self.params[idx], self.tokens[idx], self.flops[idx],
                    self.loss[idx], self.budget[idx], self.source, self.flops_counted,
                    [self.extra[i] for i in idx] if self.extra else [])

    def index(self, name: str) -> int:
        if name not in self.names:
            raise DataError(f"--holdout {name!r}: no row of {self.source} has that name; names: "
                            f"{', '.join(self.names)}")
        return self.names.index(name)

    @property
    def flops_per_param_token(self) -> float:
        """k in C = k·N·D: the rows' median (6 when no row counted its own FLOPs)."""
        return float(np.median(self.flops / (self.params * self.tokens)))


def _number(value: object, where: str, column: str, optional: bool = False) -> float:
    if value is None and optional:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DataError(f"{where}: column {column!r} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise DataError(f"{where}: column {column!r} must be a positive finite number, got {value!r}; "
                        "remove the row or fix the value")
    return float(value)


def resolve_input(path: str | Path) -> Path:
    """A sweep directory means its points.jsonl."""
    path = Path(path)
    if path.is_dir():
        path = path / POINTS_FILE
        if not path.is_file():
            raise DataError(f"{path} does not exist: the sweep has no finished point yet (run `meshlm sweep`), "
                            "or pass a JSONL file of rows")
    elif not path.is_file():
        raise DataError(f"{path} does not exist; pass a sweep directory or a JSONL file of rows with params, "
                        "tokens, loss")
    return path


def read_rows(path: str | Path, params_key: str = "params") -> Rows:
    """Read and validate the rows of a JSONL file or a sweep directory (``params_key``: which column is N)."""
    path = resolve_input(path)
    names, cols, extra = [], {k: [] for k in ("params", "tokens", "flops", "loss", "budget")}, []
    required = (params_key, "tokens", "loss")
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path} line {line_no}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object with {', '.join(required)}")
        missing = [k for k in required if k not in row]
        if missing:
            raise DataError(f"{where}: missing column(s) {', '.join(repr(m) for m in missing)}; every row needs "
                            f"{', '.join(required)} (flops optional)")
        name = str(row.get("name") or f"row{line_no}")
        if name in names:
            raise DataError(f"{where}: duplicate name {name!r}; names identify rows for --holdout")
        names.append(name)
        cols["params"].append(_number(row[params_key], where, params_key))
        cols["tokens"].append(_number(row["tokens"], where, "tokens"))
        cols["loss"].append(_number(row["loss"], where, "loss"))
        cols["flops"].append(_number(row.get("flops"), where, "flops", optional=True))
        cols["budget"].append(_number(row.get("budget"), where, "budget", optional=True))
        extra.append(row)
    if not names:
        raise DataError(f"{path} holds no rows")
    arr = {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}
    counted = bool(np.all(np.isfinite(arr["flops"])))
    arr["flops"] = np.where(np.isfinite(arr["flops"]), arr["flops"], 6.0 * arr["params"] * arr["tokens"])
    return Rows(names, arr["params"], arr["tokens"], arr["flops"], arr["loss"], arr["budget"], str(path), counted,
                extra)


def check_fittable(rows: Rows, num_params: int = 5) -> None:
    """Refuse data that cannot determine L(N, D): too few rows, one model size, or one token count."""
    if len(rows) < num_params:
        raise DataError(f"{rows.source}: {len(rows)} row(s) to fit, fewer than the {num_params} parameters of "
                        "L(N, D) = E + A/N^alpha + B/D^beta; add runs (at least 2 sizes x 3 token counts)")
    if len(np.unique(rows.params)) < 2:
        raise DataError(f"{rows.source}: every row has the same size (params = {rows.params[0]:g}); "
                        "alpha and A need at least 2 model sizes")
    if len(np.unique(rows.tokens)) < 2:
        raise DataError(f"{rows.source}: every row has the same token count (tokens = {rows.tokens[0]:g}); "
                        "beta and B need at least 2 token budgets")
