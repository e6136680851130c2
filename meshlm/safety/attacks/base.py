"""What an attack family is: its evaluation templates, its training frame, and its place in the registry.

A family holds two separate sets of wrappers for the same idea: ``templates`` build the red-team evaluation
attacks (redteam.py; every third one held out by :func:`template_split`), and ``frame`` wraps training prompts
(augment.py, synth.py). They are written apart on purpose — the evaluation measures whether a model generalises
to frames it was not trained on word for word — but kept in one module per family, so that a family is added,
read and changed in one place.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

Template = Callable[[str, random.Random], str]  # (seed prompt, rng) -> attack prompt
# (prompt, rng, act, schemes) -> the prompt in a training frame, or None when the family needs what is missing
Frame = Callable[[str, random.Random, "str | None", tuple[str, ...]], "str | None"]


@dataclass(frozen=True)
class Family:
    name: str
    rank: int  # position in the canonical order (the order of rows and of the families synthesis cycles through)
    templates: list[Template]
    frame: Frame
    summary: str = ""
    # which encoding an attack of template ``index`` used (replaying its rng draw); None for unencoded families
    encoding_of: Callable[[int, str, random.Random], str | None] = lambda index, prompt, rng: None


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    if family.name in _FAMILIES and _FAMILIES[family.name] is not family:
        raise ValueError(f"attack family {family.name!r} registered twice")
    _FAMILIES[family.name] = family
    return family


def registered() -> dict[str, Family]:
    return dict(sorted(_FAMILIES.items(), key=lambda item: (item[1].rank, item[0])))
