"""Typed config sections: plain dataclasses validated when loaded.

The lowest room beside errors.py: the job config (meshlm/config/) and the sections kept with what they configure
(``models.config.ModelConfig``, the safety spec, the scaling spec) all declare their fields with :func:`option`,
so none of them imports another's room for it.

Each component owns one dataclass. Fields carry a ``doc`` (and optionally ``choices``) in their metadata, so
``meshlm config keys`` can list every key with its type, default and meaning. Loading rejects unknown keys with
a "did you mean" hint and wrong types with the key's full dotted name.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Iterator

from meshlm.errors import ConfigError


def option(default: Any, doc: str, choices: tuple | None = None) -> Any:
    """A config field with its documentation (and allowed values)."""
    meta = {"doc": doc, "choices": choices}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def did_you_mean(name: str, candidates: typing.Iterable[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.5)
    return f" (did you mean '{prefix}{close[0]}'?)" if close else ""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _type_name(args[0]) + " | None"
    if origin is list:
        return f"list[{_type_name(typing.get_args(tp)[0])}]"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(value, args[0], key)
    if origin is list:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, typing.get_args(tp)[0], key) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if not math.isfinite(out):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return out
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise AssertionError(f"unsupported config type {tp} for {key}")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls: type, data: dict[str, Any], section: str, base: Any = None) -> Any:
    """Build ``cls`` from ``data``, starting from ``base`` (or the defaults), validating every key."""
    if not isinstance(data, dict):
        raise ConfigError(f"[{section}] must be a table of keys, got {data!r}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = dataclasses.asdict(base) if base is not None else {}
    for name, raw in data.items():
        key = f"{section}.{name}"
        if name not in fields:
            raise ConfigError(f"unknown config key '{key}'{did_you_mean(name, fields, section + '.')}; "
                              f"see `meshlm config keys` for the valid ones")
        value = _coerce(raw, hints[name], key)
        choices = fields[name].metadata.get("choices")
        if choices and value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, choices))}")
        values[name] = value
    try:
        obj = cls(**values)
    except TypeError as exc:  # a field without default left unset
        raise ConfigError(f"[{section}]: {exc}") from None
    check = getattr(obj, "validate", None)
    if check is not None:
        check()
    return obj


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def describe(cls: type, section: str) -> Iterator[tuple[str, str, Any, str]]:
    """Yield (key, type, default, doc) for every field of a section."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        doc = f.metadata.get("doc", "")
        if f.metadata.get("choices"):
            doc += f" One of: {', '.join(map(str, f.metadata['choices']))}."
        yield f"{section}.{f.name}", _type_name(hints[f.name]), default, doc


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise AssertionError(f"cannot write {value!r} as TOML")


def dumps_toml(sections: dict[str, dict[str, Any]]) -> str:
    """Write a two-level dict as TOML. ``None`` values are omitted (TOML has no null)."""
    lines: list[str] = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        for key, value in table.items():
            if value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)
