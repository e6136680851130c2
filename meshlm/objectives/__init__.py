"""Objectives turn a batch into a loss. The trainer knows nothing about any particular one."""

from __future__ import annotations

from meshlm.config.posttrain import ObjectiveConfig
from meshlm.objectives.base import Objective, ObjectiveContext
from meshlm.objectives.kto import KTOObjective
from meshlm.objectives.preference import PreferenceObjective
from meshlm.objectives.pretrain import NextTokenObjective
from meshlm.objectives.reward import RewardObjective
from meshlm.objectives.rl import GRPOObjective, PPOObjective
from meshlm.objectives.sft import SFTObjective

OBJECTIVES = {"pretrain": NextTokenObjective, "sft": SFTObjective, "reward": RewardObjective,
              "dpo": PreferenceObjective, "ppo": PPOObjective, "grpo": GRPOObjective}


def build_objective(name: str, cfg: ObjectiveConfig | None = None) -> Objective:
    """The objective ``training.objective`` names, configured by the ``[objective]`` section."""
    cls = OBJECTIVES[name]
    if cls is PreferenceObjective and cfg is not None and cfg.loss_type == "kto":
        cls = KTOObjective  # the DPO family's unpaired member: its own data and reference point
    return cls() if cls is NextTokenObjective else cls(cfg or ObjectiveConfig())


__all__ = ["Objective", "ObjectiveContext", "NextTokenObjective", "SFTObjective", "RewardObjective",
           "PreferenceObjective", "KTOObjective", "PPOObjective", "GRPOObjective", "OBJECTIVES", "build_objective"]
