"""The behaviour specification: which requests to refuse, answer with a warning, or answer.

API (used by data synthesis, red teaming, constitutional critique and evaluation)::

    spec = load_spec()              # the embedded default (meshlm/safety/spec.toml)
    spec = load_spec("my.toml")     # a user's spec, same format; errors name the file and the key
    spec.version                    # "1.0"
    spec.categories["weapons"]      # Category(name, policy, description, principles, seed_prompts, guidance)
    spec.principles()               # every category's principles, in file order, without duplicates
    spec.by_policy("refuse")        # the refuse categories, in file order

File format (TOML): top-level ``version`` (string) and optional ``name``; one ``[categories.NAME]`` table per
category with ``policy`` (refuse | warn | answer), ``description`` (string), ``principles`` (non-empty list of
strings), ``seed_prompts`` (non-empty list of strings) and ``guidance`` (string). Unknown keys are errors, so
a typo is never silently ignored.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshlm.errors import ConfigError
from meshlm.safety.taxonomy import POLICIES, STANDARD_CATEGORIES  # noqa: F401 (re-exported: spec.POLICIES)
from meshlm.sections import did_you_mean

DEFAULT_SPEC = Path(__file__).with_name("spec.toml")
_CATEGORY_KEYS = ("policy", "description", "principles", "seed_prompts", "guidance")
_TOP_KEYS = ("version", "name", "categories")


class SpecError(ConfigError):
    """An invalid behaviour spec; the message names the file and the key."""


@dataclass(frozen=True)
class Category:
    name: str
    policy: str
    description: str
    principles: list[str]
    seed_prompts: list[str]
    guidance: str


@dataclass(frozen=True)
class Spec:
    version: str
    categories: dict[str, Category]
    name: str = ""
    path: str = ""
    sha256: str = field(default="", compare=False)  # of the file's bytes: recorded in manifests and reports

    def principles(self) -> list[str]:
        """All principles of all categories, in file order, each once."""
        return list(dict.fromkeys(p for c in self.categories.values() for p in c.principles))

    def by_policy(self, policy: str) -> list[Category]:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; one of {POLICIES}")
        return [c for c in self.categories.values() if c.policy == policy]

    def policy_of(self, category: str) -> str:
        return self.categories[category].policy


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"{where} must be a non-empty string, got {value!r}")
    return value.strip()


def _string_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise SpecError(f"{where} must be a non-empty list of strings, got {value!r}")
    return [_string(v, f"{where}[{i}]") for i, v in enumerate(value)]


def _category(name: str, table: Any, src: str) -> Category:
    where = f"{src}: categories.{name}"
    if not isinstance(table, dict):
        raise SpecError(f"{where} must be a table ([categories.{name}]), got {table!r}")
    for key in table:
        if key not in _CATEGORY_KEYS:
            raise SpecError(f"{where}.{key} is not a category key{did_you_mean(key, _CATEGORY_KEYS)}; "
                            f"valid keys: {', '.join(_CATEGORY_KEYS)}")
    missing = [k for k in _CATEGORY_KEYS if k not in table]
    if missing:
        raise SpecError(f"{where} is missing {', '.join(missing)} (every category needs "
                        f"{', '.join(_CATEGORY_KEYS)})")
    policy = table["policy"]
    if policy not in POLICIES:
        raise SpecError(f"{where}.policy is {policy!r}; it must be one of {', '.join(POLICIES)}")
    return Category(name=name, policy=policy, description=_string(table["description"], f"{where}.description"),
                    principles=_string_list(table["principles"], f"{where}.principles"),
                    seed_prompts=_string_list(table["seed_prompts"], f"{where}.seed_prompts"),
                    guidance=_string(table["guidance"], f"{where}.guidance"))


def parse_spec(raw: dict[str, Any], src: str, sha256: str = "") -> Spec:
    """Validate a parsed TOML document into a :class:`Spec` (``src`` names it in errors)."""
    for key in raw:
        if key not in _TOP_KEYS:
            raise SpecError(f"{src}: '{key}' is not a top-level spec key{did_you_mean(key, _TOP_KEYS)}; "
                            f"valid keys: {', '.join(_TOP_KEYS)}")
    if "version" not in raw:
        raise SpecError(f"{src}: 'version' is missing; add e.g. version = \"1.0\" at the top")
    version = _string(str(raw["version"]) if isinstance(raw["version"], (int, float)) else raw["version"],
                      f"{src}: version")
    tables = raw.get("categories")
    if not isinstance(tables, dict) or not tables:
        raise SpecError(f"{src}: no categories; add at least one [categories.NAME] table")
    categories = {}
    for name, table in tables.items():
        if not name.replace("_", "").isalnum():
            raise SpecError(f"{src}: category name {name!r} must be letters, digits and underscores")
        categories[name] = _category(name, table, src)
    name = _string(raw["name"], f"{src}: name") if "name" in raw else ""
    return Spec(version=version, categories=categories, name=name, path=src, sha256=sha256)


def load_spec(path: str | Path | None = None) -> Spec:
    """The spec at ``path``, or the embedded default when ``path`` is None or empty."""
    path = Path(path) if path else DEFAULT_SPEC
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"spec file '{path}' does not exist; pass an existing .toml file "
                        f"(the default is {DEFAULT_SPEC})") from None
    except OSError as exc:
        raise SpecError(f"cannot read spec file '{path}': {exc.strerror}") from None
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"spec file '{path}' is not valid TOML: {exc}") from None
    return parse_spec(raw, str(path), hashlib.sha256(data).hexdigest())
