"""Synthesis material as data: one TOML file per spec category (what is asked, and the parts of the response its
policy calls for) and ``framings.toml`` (how requests are phrased, shared by the categories of a policy).

A category file names its ``policy``; material is used only for a category of that policy, so a user's spec
that gives a standard category another policy falls back to its seed prompts, as it would without a file.
"""

from __future__ import annotations

import functools
import re
import tomllib
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).parent


@functools.cache
def _read(name: str) -> dict[str, Any]:
    path = FOLDER / f"{name}.toml"
    if not re.fullmatch(r"\w+", name) or not path.is_file():
        return {}
    return tomllib.loads(path.read_text(encoding="utf-8"))


def category(name: str, policy: str) -> dict[str, Any]:
    """The material of category ``name`` when it is written for ``policy``, else ``{}`` (do not modify it)."""
    found = _read(name)
    return found if found.get("policy") == policy else {}


def framings() -> dict[str, list[str]]:
    return _read("framings")
