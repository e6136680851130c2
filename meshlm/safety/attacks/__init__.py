"""Jailbreak families as plug-ins: each module of this package (other than base, encoders and text) is one
family, holding both its red-team evaluation templates and its training frames (base.py).

    names()                          # the families in canonical order
    family("roleplay").templates     # evaluation templates (redteam.py)
    family("roleplay").frame(...)    # a training frame (augment.wrap_attack, synth.py)
    template_split("roleplay", "eval")

Adding a family is adding one module here that calls :func:`~.base.register`; redteam, augment, synthesis and
the align config read the registry. Every template is deterministic given its rng, and nothing here adds
harmful content: the wrappers only reframe the seed prompt (the fake dialogues of ``many_shot`` are vague,
"Sure, here is how" placeholders).
"""

from __future__ import annotations

import importlib
import pkgutil
import random

from meshlm.safety.attacks.base import Family, Template, register, registered
from meshlm.safety.attacks.encoders import ENCODINGS, decode, encode
from meshlm.safety.attacks.text import action, inline, split_payload, verb_phrase

_SUPPORT = {"base", "encoders", "text"}
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _SUPPORT:
        importlib.import_module(f"{__name__}.{_module.name}")


def names() -> list[str]:
    return list(registered())


def family(name: str) -> Family:
    found = registered().get(name)
    if found is None:
        raise KeyError(f"unknown attack family {name!r}; one of {', '.join(names())}")
    return found


# name -> evaluation templates, in canonical order
FAMILIES: dict[str, list[Template]] = {name: fam.templates for name, fam in registered().items()}


def template_split(name: str, split: str | None) -> list[int]:
    """Indices of the family's templates in ``split``: every third template (2, 5, 8, ...) is held out for
    ``"eval"``, the others are ``"train"``; ``None`` means all of them."""
    n = len(family(name).templates)
    if split is None:
        return list(range(n))
    return [i for i in range(n) if (i % 3 == 2) == (split == "eval")]


def encoding_of(name: str, index: int, prompt: str, rng: random.Random) -> str | None:
    """Which encoding an attack of the family's template ``index`` used (replaying its rng draw), else None."""
    return family(name).encoding_of(index, prompt, rng)


__all__ = ["ENCODINGS", "FAMILIES", "Family", "Template", "action", "decode", "encode", "encoding_of", "family",
           "inline", "names", "register", "split_payload", "template_split", "verb_phrase"]
