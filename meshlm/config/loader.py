"""Load a job config: TOML file, then ``--set section.key=value`` overrides, then validation."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Iterable

from meshlm.config.base import did_you_mean, dumps_toml, from_dict, to_dict
from meshlm.config.schema import SECTIONS, JobConfig
from meshlm.errors import ConfigError
from meshlm.models.flavors import flavor_config


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
    model_raw = dict(raw.get("model", {}))
    base = flavor_config(str(model_raw.get("flavor", "debug")))
    sections: dict[str, Any] = {"model": from_dict(SECTIONS["model"], model_raw, "model", base=base)}
    for name, cls in SECTIONS.items():
        if name != "model":
            sections[name] = from_dict(cls, raw.get(name, {}), name)
    cfg = JobConfig(**sections)
    cfg.validate()
    return cfg


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> JobConfig:
    raw = read_toml(path) if path else {}
    return build_config(apply_overrides(raw, overrides))


def config_to_toml(cfg: JobConfig) -> str:
    return dumps_toml({name: to_dict(getattr(cfg, name)) for name in SECTIONS})
