"""Objectives turn a batch into a loss. The trainer knows nothing about any particular one: it calls the hooks
of :class:`Objective` (objectives/base.py), and finds the class that ``training.objective`` names in the
catalog (meshlm/config/catalog.py, one line per objective)."""

from __future__ import annotations

from meshlm.config.catalog import OBJECTIVES, import_objective
from meshlm.config.posttrain import ObjectiveConfig
from meshlm.errors import ConfigError
from meshlm.objectives.base import Objective, ObjectiveContext
from meshlm.objectives.kto import KTOObjective
from meshlm.objectives.preference import PreferenceObjective
from meshlm.objectives.pretrain import NextTokenObjective
from meshlm.objectives.reward import RewardObjective
from meshlm.objectives.rl import GRPOObjective, PPOObjective
from meshlm.objectives.sft import SFTObjective


def objective_class(name: str) -> type[Objective]:
    """The class registered as ``name`` (imported on first use)."""
    cls = import_objective(name)
    if not issubclass(cls, Objective):
        raise ConfigError(f"training.objective {name!r}: {OBJECTIVES[name]} is not an Objective subclass")
    return cls


def build_objective(name: str, cfg: ObjectiveConfig | None = None) -> Objective:
    """The objective ``training.objective`` names, configured by the ``[objective]`` section."""
    return objective_class(name).configured(cfg if cfg is not None else ObjectiveConfig())


__all__ = ["Objective", "ObjectiveContext", "NextTokenObjective", "SFTObjective", "RewardObjective",
           "PreferenceObjective", "KTOObjective", "PPOObjective", "GRPOObjective", "build_objective",
           "objective_class"]
