"""The judges, as plug-ins found by name: ``--judge NAME[:ARG]`` wherever meshlm judges.

    judge = make_judge("rule")                          # or "encoder[:DIR]", "trained:DIR", "llm:URL#MODEL"
    labels = judge.label(prompts, responses)            # taxonomy.LABELS
    add_judge_arguments(parser)                         # --judge and every plug-in's own flags
    judge = make_judge(args.judge, judge_options(args))

Every module of this package other than ``base`` is a plug-in: it defines a :class:`~.base.Judge` subclass and
decorates it with :func:`register`. Adding a judge is adding one module here; nothing else names the kinds.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from typing import Any, Mapping

from meshlm.errors import UserError
from meshlm.safety.judges.base import Flag, Judge

DEFAULT = "rule"
_KINDS: dict[str, type[Judge]] = {}
_loaded = False


def register(cls: type[Judge]) -> type[Judge]:
    """Class decorator of a plug-in: ``@register class MyJudge(Judge): kind = "mine"``."""
    if not cls.kind or cls.kind in _KINDS and _KINDS[cls.kind] is not cls:
        raise ValueError(f"judge kind {cls.kind!r} is empty or registered twice")
    _KINDS[cls.kind] = cls
    return cls


def kinds() -> dict[str, type[Judge]]:
    """Every registered judge by kind, the default first (the package's modules are imported once)."""
    global _loaded
    if not _loaded:
        for module in pkgutil.iter_modules(__path__):
            if module.name != "base":
                importlib.import_module(f"{__name__}.{module.name}")
        _loaded = True
    return dict(sorted(_KINDS.items(), key=lambda item: (item[0] != DEFAULT, item[0])))


def forms() -> str:
    """``rule | encoder[:DIR] | ...``: the accepted ``--judge`` values, for help and errors."""
    return " | ".join(k + (f"[:{c.arg}]" if c.arg and c.arg_optional else f":{c.arg}" if c.arg else "")
                      for k, c in kinds().items())


def parse_spec(spec: str | None) -> tuple[type[Judge], str]:
    """The plug-in and the ARG of ``NAME[:ARG]``, checked (nothing is loaded)."""
    text = (spec or DEFAULT).strip()
    kind, _, arg = text.partition(":")
    found = kinds().get(kind)
    if found is None or (bool(arg) and not found.arg) or (found.arg and not arg and not found.arg_optional):
        raise UserError(f"--judge {text!r}: expected {forms()}")
    return found, arg


def make_judge(spec: str | None, options: Mapping[str, Any] | None = None) -> Judge:
    """The judge ``NAME[:ARG]`` (the default when None); ``options``: its flags' values by ``dest``."""
    cls, arg = parse_spec(spec)
    values = {flag.dest: None for flag in cls.flags}
    values.update({k: v for k, v in (options or {}).items() if k in values})
    return cls.load(arg, values)


def add_judge_arguments(parser: argparse.ArgumentParser, what: str = "the responses") -> None:
    """``--judge`` and the flags every plug-in reads when it is loaded."""
    parser.add_argument("--judge", default=DEFAULT, help=f"judge of {what}: {forms()} (default {DEFAULT})")
    for cls in kinds().values():
        for flag in cls.flags:
            parser.add_argument(flag.name, type=flag.type, help=f"{cls.kind} judge: {flag.help}")


def judge_options(args: argparse.Namespace) -> dict[str, Any]:
    return {flag.dest: getattr(args, flag.dest, None) for cls in kinds().values() for flag in cls.flags}


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The training flags of every trainable plug-in (``meshlm judge --train-judge``)."""
    for cls in kinds().values():
        for flag in cls.train_flags:
            parser.add_argument(flag.name, type=flag.type, help=f"{cls.kind} judge training: {flag.help}")


def trainer_for(args: argparse.Namespace, default: str = "trained") -> type[Judge]:
    """The trainable kind whose training flags were given (``default`` when none); a mix of two kinds' flags is
    a UserError naming which flag belongs to which."""
    given = {cls.kind: [f.name for f in cls.train_flags if getattr(args, f.dest, None) is not None]
             for cls in kinds().values() if cls.trainable()}
    chosen = [kind for kind, names in given.items() if names]
    if len(chosen) > 1:
        raise UserError("; ".join(f"{', '.join(given[k])} for the {k} judge" for k in chosen)
                        + ": give the training flags of one kind of judge")
    cls = kinds()[chosen[0] if chosen else default]
    missing = [f.name for f in cls.train_flags if f.required and getattr(args, f.dest, None) is None]
    if missing:
        raise UserError(f"{', '.join(given[cls.kind])} train the {cls.kind} judge, which also needs "
                        f"{', '.join(missing)}")
    return cls


def train_options(cls: type[Judge], args: argparse.Namespace) -> dict[str, Any]:
    return {flag.dest: getattr(args, flag.dest, None) for flag in cls.train_flags}


__all__ = ["DEFAULT", "Flag", "Judge", "add_judge_arguments", "add_train_arguments", "forms", "judge_options",
           "kinds", "make_judge", "parse_spec", "register", "train_options", "trainer_for"]
