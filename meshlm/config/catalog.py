"""The objectives a config may name, one line each: ``training.objective`` value -> "module:Class".

This is the registration of an objective (its module holds everything else: its data kind, the [objective] keys
it reads, its hooks). Kept here, torch-free, so that the config layer checks ``training.objective`` and
`meshlm config keys` lists the names without importing any objective; the class is imported on use
(:func:`import_objective`, :func:`meshlm.objectives.build_objective`). Rooms below meshlm/objectives (data/, which
asks an objective's data kind) reach an objective only through this registry, as they would a plug-in's.
"""

from __future__ import annotations

import importlib

from meshlm.errors import ConfigError

OBJECTIVES: dict[str, str] = {
    "pretrain": "meshlm.objectives.pretrain:NextTokenObjective",
    "sft": "meshlm.objectives.sft:SFTObjective",
    "reward": "meshlm.objectives.reward:RewardObjective",
    "classify": "meshlm.objectives.classify:ClassifyObjective",
    "dpo": "meshlm.objectives.preference:PreferenceObjective",  # its loss_type "kto" is KTOObjective
    "ppo": "meshlm.objectives.rl:PPOObjective",
    "grpo": "meshlm.objectives.rl:GRPOObjective",
}


def register_objective(name: str, target: str) -> None:
    """Add an objective at run time (a plug-in outside meshlm, a test): ``target`` is "module:Class"."""
    if ":" not in target:
        raise ValueError(f"objective {name!r}: target {target!r} must be 'module:Class'")
    OBJECTIVES[name] = target


def import_objective(name: str) -> type:
    """The class registered as ``name``, imported on first use (:func:`meshlm.objectives.objective_class` also
    checks that it subclasses ``Objective``)."""
    if name not in OBJECTIVES:
        raise ConfigError(f"training.objective {name!r} is not one of {', '.join(OBJECTIVES)}")
    module, _, attr = OBJECTIVES[name].partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and isinstance(getattr(cls, "data_kind", None), str)):
        raise ConfigError(f"training.objective {name!r}: {OBJECTIVES[name]} is not an Objective subclass")
    return cls
