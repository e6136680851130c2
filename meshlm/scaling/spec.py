"""A sweep file (TOML) and the points it expands to.

```toml
[sweep]
base = "debug.toml"         # the job config every point starts from (relative to this file, or a packaged name)
set = ["data.seq_len=64"]   # overrides for every point
kind = "isoflop"            # "isoflop": for each budget C, every size with D = C / flops_per_token(N)
flops = [1e12, 3e12]        #   (counted FLOPs per token, attention included: meshlm.train.flops)
# kind = "grid"; tokens = [2e5, 4e5]   # every size x every token budget
min_steps = 20              # isoflop: sizes that would train fewer optimizer steps are left out
max_tokens = 1_000_000      # isoflop: sizes that would train on more tokens are left out (e.g. one epoch)
min_tokens_per_param = 1.0  # isoflop: sizes that would see fewer tokens per parameter are left out
heldout_tokens = 65536      # held-out (val split) tokens evaluated at the end of each point

[sweep.sizes]               # the width/depth rule (or [[sweep.models]] with name and set = [...])
depths = [1, 2, 3, 4]       # n_layers
aspect = 32                 # dim = aspect * depth, rounded up to a multiple of head_dim
head_dim = 16               # n_heads = dim / head_dim
kv_ratio = 1                # n_kv_heads = n_heads / kv_ratio (when it divides)
ffn_ratio = 2.6667          # ffn_hidden_dim = ffn_ratio * dim, rounded up to a multiple of multiple_of
multiple_of = 16
```

Tokens are counted in optimizer steps: steps = round(D / (batch_size * seq_len)), so a point's D (and C) is
what it actually trained on, not the nominal target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshlm.config.loader import load_config, read_toml
from meshlm.config.schema import JobConfig
from meshlm.errors import ConfigError
from meshlm.models.config import ModelConfig
from meshlm.sections import did_you_mean
from meshlm.train.flops import model_flops_per_token

SWEEP_KEYS = ("base", "set", "kind", "flops", "tokens", "min_steps", "max_tokens", "min_tokens_per_param",
              "heldout_tokens", "sizes", "models")
SIZE_KEYS = {"depths": None, "aspect": 64, "head_dim": 32, "kv_ratio": 1, "ffn_ratio": 8 / 3, "multiple_of": 32}


@dataclass
class Point:
    name: str
    model: str
    overrides: list[str]  # the base config's overrides for this point (sweep set + size + steps)
    params: int
    non_embedding_params: int
    flops_per_token: float
    steps: int
    tokens_per_step: int
    budget: float | None = None  # the IsoFLOP group's nominal C

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step

    @property
    def flops(self) -> float:
        return self.flops_per_token * self.tokens


@dataclass
class SweepSpec:
    path: Path
    base: Path
    kind: str
    points: list[Point]
    skipped: list[dict] = field(default_factory=list)  # isoflop sizes left out, with the reason
    heldout_tokens: int = 65536


def non_embedding_params(cfg: ModelConfig) -> int:
    """Parameters without the token embedding and the output head (Kaplan et al.'s N)."""
    vocab_matrices = 1 if cfg.tie_embeddings else 2
    return cfg.num_params() - vocab_matrices * cfg.vocab_size * cfg.dim


def _short(value: float) -> str:
    """512 -> "512", 1024 -> "1.02e3", 2e12 -> "2e12": compact and unique enough for point names."""
    text = f"{value:.3g}"
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    return text


def _round_up(value: float, multiple: int) -> int:
    return int(math.ceil(value / multiple - 1e-9)) * multiple


def size_overrides(rule: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(name, [model.* overrides]) per depth, by the width/depth rule of the module docstring."""
    unknown = [k for k in rule if k not in SIZE_KEYS]
    if unknown:
        raise ConfigError(f"[sweep.sizes]: unknown key '{unknown[0]}'{did_you_mean(unknown[0], SIZE_KEYS)}; "
                          f"valid keys: {', '.join(SIZE_KEYS)}")
    r = {**SIZE_KEYS, **rule}
    depths = r["depths"]
    if not isinstance(depths, list) or not depths or not all(isinstance(d, int) and d > 0 for d in depths):
        raise ConfigError("[sweep.sizes] depths must be a list of positive integers, e.g. depths = [1, 2, 4]")
    out = []
    for depth in depths:
        dim = _round_up(r["aspect"] * depth, r["head_dim"])
        heads = dim // r["head_dim"]
        kv = heads // r["kv_ratio"] if heads % r["kv_ratio"] == 0 else heads
        ffn = _round_up(r["ffn_ratio"] * dim, r["multiple_of"])
        out.append((f"d{depth}", [f"model.n_layers={depth}", f"model.dim={dim}", f"model.n_heads={heads}",
                                  f"model.n_kv_heads={kv}", "model.head_dim=0", f"model.ffn_hidden_dim={ffn}"]))
    return out


def model_overrides(models: Any) -> list[tuple[str, list[str]]]:
    if not isinstance(models, list) or not models:
        raise ConfigError("[[sweep.models]] must be a list of tables with name and set = [...]")
    out = []
    for i, m in enumerate(models):
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not isinstance(m.get("set", []), list):
            raise ConfigError(f"[[sweep.models]] entry {i + 1}: needs name = \"...\" and set = [\"model.dim=64\", ...]")
        out.append((m["name"], [str(s) for s in m.get("set", [])]))
    if len({n for n, _ in out}) != len(out):
        raise ConfigError("[[sweep.models]]: two entries share a name; names must be unique")
    return out


def resolve_base(base: str, sweep_file: Path) -> Path:
    """``base`` relative to the sweep file, else a config packaged with meshlm (meshlm/configs/)."""
    for candidate in (sweep_file.parent / base, Path(__file__).resolve().parent.parent / "configs" / base):
        if candidate.is_file():
            return candidate.resolve()
    raise ConfigError(f"{sweep_file}: sweep.base '{base}' is neither beside the sweep file nor a packaged config "
                      "(debug.toml, small.toml, ...)")


def _budgets(raw: dict, key: str, path: Path) -> list[float]:
    values = raw.get(key)
    if not isinstance(values, list) or not values or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        raise ConfigError(f"{path}: sweep.{key} must be a non-empty list of positive numbers, "
                          f"e.g. {key} = [1e12, 3e12]")
    return sorted(float(v) for v in values)


def _point_config(base: Path, overrides: list[str], where: str) -> JobConfig:
    try:
        return load_config(base, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_sweep(path: str | Path) -> SweepSpec:
    """Read a sweep file and expand it into points (configs validated, sizes and FLOPs counted)."""
    path = Path(path)
    raw = read_toml(path).get("sweep")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: no [sweep] table; see configs/sweep-embedded.toml")
    unknown = [k for k in raw if k not in SWEEP_KEYS]
    if unknown:
        raise ConfigError(f"{path}: unknown key sweep.{unknown[0]}{did_you_mean(unknown[0], SWEEP_KEYS, 'sweep.')}")
    base = resolve_base(str(raw.get("base", "debug.toml")), path)
    common = [str(s) for s in raw.get("set", [])]
    kind = raw.get("kind", "grid")
    if kind not in ("grid", "isoflop"):
        raise ConfigError(f"{path}: sweep.kind must be 'grid' or 'isoflop', got {kind!r}")
    if ("sizes" in raw) == ("models" in raw):
        raise ConfigError(f"{path}: give either [sweep.sizes] (the width/depth rule) or [[sweep.models]], not both")
    sizes = size_overrides(raw["sizes"]) if "sizes" in raw else model_overrides(raw["models"])
    min_steps = int(raw.get("min_steps", 1))
    max_tokens = float(raw.get("max_tokens", math.inf))
    min_ratio = float(raw.get("min_tokens_per_param", 0.0))
    heldout = int(raw.get("heldout_tokens", 65536))
    if min_steps < 1 or heldout < 1 or max_tokens <= 0:
        raise ConfigError(f"{path}: sweep.min_steps, sweep.max_tokens and sweep.heldout_tokens must be positive")
    points, skipped = [], []
    for model, overrides in sizes:
        cfg = _point_config(base, common + overrides, f"{path}: size {model}")
        if not cfg.checkpoint.enabled:
            raise ConfigError(f"{path}: checkpoint.enabled is false; a sweep needs checkpoints (to resume and to "
                              "evaluate the held-out loss)")
        fpt = model_flops_per_token(cfg.model, cfg.data.seq_len)
        tps = cfg.training.batch_size * cfg.data.seq_len
        shape = dict(model=model, params=cfg.model.num_params(), non_embedding_params=non_embedding_params(cfg.model),
                     flops_per_token=fpt, tokens_per_step=tps)
        targets = ([(t, None) for t in _budgets(raw, "tokens", path)] if kind == "grid"
                   else [(c / fpt, c) for c in _budgets(raw, "flops", path)])
        for tokens, budget in targets:
            steps = max(1, round(tokens / tps))
            name = f"{model}-D{_short(tokens)}" if budget is None else f"C{_short(budget)}-{model}"
            if budget is not None and steps < min_steps:
                skipped.append({"name": name, "reason": f"{steps} steps < sweep.min_steps ({min_steps})"})
                continue
            if budget is not None and steps * tps > max_tokens:
                skipped.append({"name": name,
                                "reason": f"{steps * tps:,} tokens > sweep.max_tokens ({max_tokens:,.0f})"})
                continue
            if budget is not None and steps * tps < min_ratio * shape["params"]:
                skipped.append({"name": name, "reason": f"{steps * tps / shape['params']:.2g} tokens per parameter < "
                                                        f"sweep.min_tokens_per_param ({min_ratio:g})"})
                continue
            points.append(Point(name=name, overrides=common + overrides + [f"training.steps={steps}"], steps=steps,
                                budget=budget, **shape))
    if not points:
        raise ConfigError(f"{path}: every point was left out (sweep.min_steps = {min_steps}); raise the budgets")
    if kind == "isoflop":
        points.sort(key=lambda p: (p.budget, p.params))
    return SweepSpec(path, base, kind, points, skipped, heldout)
