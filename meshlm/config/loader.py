"""Load a job config: TOML file, then ``--set section.key=value`` overrides, then validation.

Which keys a user set is what the raw tables hold after the overrides (defaults are never in them). That is how
``checkpoint.init_from`` works (:func:`inherit_init_from`, used by ``meshlm train`` and ``meshlm align``): the
[model] keys the config leaves out come from the checkpoint's own config, so a config states only what it
changes; a key it sets that fixes the weights' shapes (``SHAPE_KEYS``) and contradicts the checkpoint is an
error naming both values. ``model.flavor`` only names the shape of a model trained from scratch, so with
init_from the checkpoint's flavour is kept (configs/sft.toml's ``flavor = "debug"`` fine-tunes any model).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Iterable

from meshlm.config.schema import SECTIONS, JobConfig
from meshlm.errors import CheckpointError, ConfigError
from meshlm.models.config import CUSTOM_FLAVOR, SHAPE_KEYS, ModelConfig
from meshlm.models.flavors import flavor_config
from meshlm.sections import did_you_mean, dumps_toml, from_dict, to_dict


def read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file '{path}' does not exist; pass an existing .toml file "
                          "(see configs/ for examples)") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file '{path}' is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file '{path}': {exc.strerror}") from None


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings. Values are parsed as TOML when possible, else kept as strings."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. --set training.steps=10")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"--set {item!r}: the key must be section.key, e.g. training.steps")
        section, name = parts
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        out.setdefault(section, {})[name] = value
    return out


def build_config(raw: dict[str, Any]) -> JobConfig:
    """Validate a raw two-level dict into a JobConfig."""
    for section, table in raw.items():
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section '[{section}]'{did_you_mean(section, SECTIONS)}; "
                              f"valid sections: {', '.join(SECTIONS)}")
        if not isinstance(table, dict):
            raise ConfigError(f"'{section}' must be a [section] table, got {table!r}")
    sections: dict[str, Any] = {"model": model_section(raw.get("model", {}))}
    for name, cls in SECTIONS.items():
        if name != "model":
            sections[name] = from_dict(cls, raw.get(name, {}), name)
    cfg = JobConfig(**sections)
    cfg.validate()
    return cfg


def model_section(table: dict[str, Any]) -> ModelConfig:
    """The [model] table on top of its flavour (or of the defaults, for a "custom" shape)."""
    if not isinstance(table, dict):
        raise ConfigError(f"'model' must be a [section] table, got {table!r}")
    flavor = str(table.get("flavor", "debug"))
    base = ModelConfig(flavor=CUSTOM_FLAVOR) if flavor == CUSTOM_FLAVOR else flavor_config(flavor)
    return from_dict(ModelConfig, table, "model", base=base)


def load_config(path: str | Path | None, overrides: Iterable[str] = (), *, inherit: bool = False) -> JobConfig:
    """``inherit``: take the [model] keys the config leaves out from ``checkpoint.init_from`` (see the module
    docstring); for configs that start a run, not for a checkpoint's own saved config."""
    raw = apply_overrides(read_toml(path) if path else {}, overrides)
    return build_config(inherit_init_from(raw) if inherit else raw)


def inherit_init_from(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with its [model] table completed from ``checkpoint.init_from``'s config (unchanged without
    init_from); refuses a shape key that contradicts the checkpoint."""
    init_from = (raw.get("checkpoint") or {}).get("init_from") if isinstance(raw.get("checkpoint"), dict) else None
    if not init_from or not isinstance(init_from, str):
        return raw
    source = checkpoint_config_file(Path(init_from))
    theirs = read_toml(source).get("model", {})
    mine = {k: v for k, v in (raw.get("model") or {}).items() if k != "flavor"}
    merged = {**theirs, **mine}
    ckpt_model, new_model = model_section(theirs), model_section(merged)
    for key in SHAPE_KEYS:
        have, want = getattr(ckpt_model, key), getattr(new_model, key)
        if key == "head_dim":
            have, want = ckpt_model.resolved_head_dim, new_model.resolved_head_dim
        if have != want:
            raise ConfigError(f"model.{key} = {mine.get(key, want)!r} contradicts checkpoint.init_from "
                              f"'{init_from}', whose model has {key} = {have!r} ({source}); leave model.{key} out "
                              "(the checkpoint's shape is used) or start from another checkpoint")
    return {**raw, "model": merged}


def checkpoint_config_file(path: Path) -> Path:
    """The config a checkpoint was written with: a step folder's config.toml, else the newest step's of a run
    directory, else the run directory's config.resolved.toml."""
    if not path.exists():
        raise CheckpointError(f"checkpoint.init_from '{path}' does not exist; pass a run directory or a "
                              "RUN_DIR/checkpoints/step-XXXXXXXX folder")
    steps = sorted((path / "checkpoints").glob("step-*[0-9]")) if (path / "checkpoints").is_dir() else []
    for candidate in (path / "config.toml", *(s / "config.toml" for s in reversed(steps)),
                      path / "config.resolved.toml"):
        if candidate.is_file():
            return candidate
    raise CheckpointError(f"checkpoint.init_from '{path}' holds no config.toml or config.resolved.toml; pass a "
                          "run directory or a step folder written by meshlm")


def config_to_toml(cfg: JobConfig) -> str:
    return dumps_toml({name: to_dict(getattr(cfg, name)) for name in SECTIONS})
