"""The manifest of evaluation files (evalsets.toml): every labelled judge set, held-out prompt set and factual set
shipped in meshlm/safety/data, its role (dev: tuned against; sealed: never tuned on), who wrote it and the first
look at it. Code that needs "the sealed judge sets" or "every held-out prompt file" asks here rather than
listing names or globbing.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

MANIFEST = Path(__file__).with_name("evalsets.toml")
DATA = Path(__file__).parent / "data"
KINDS = ("judge", "prompts", "factual")
ROLES = ("dev", "sealed")


@dataclass(frozen=True)
class EvalSet:
    file: str
    kind: str
    role: str
    writer: str
    first_look: str
    about: str
    rows: int | None = None
    former: str = ""
    expected: bool = False  # listed before its writers deliver it
    rule_fitted: bool = True  # a dev judge set the rule judge's rules were fitted to (false: labelled after them)

    @property
    def path(self) -> Path:
        return DATA / self.file


@functools.cache
def all_sets() -> tuple[EvalSet, ...]:
    sets = tuple(EvalSet(**entry) for entry in tomllib.loads(MANIFEST.read_text(encoding="utf-8"))["set"])
    bad = [s.file for s in sets if s.kind not in KINDS or s.role not in ROLES]
    assert not bad, f"{MANIFEST}: unknown kind or role for {bad}"  # a shipped file, checked by tests
    return sets


def sets(kind: str, role: str | None = None) -> list[EvalSet]:
    """The sets of ``kind`` (and ``role``) that are present, in manifest order."""
    return [s for s in all_sets() if s.kind == kind and role in (None, s.role) and s.path.is_file()]


def names(kind: str, role: str | None = None) -> list[str]:
    return [s.file for s in sets(kind, role)]


def rule_fitted_names() -> list[str]:
    """The dev judge sets the rule judge's rules were fitted to (its regression floor); dev sets labelled after
    the rules, such as the real small-model responses, train the learned judges but do not bind the rules."""
    return [s.file for s in sets("judge", "dev") if s.rule_fitted]
