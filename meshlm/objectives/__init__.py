"""Objectives turn a batch into a loss. The trainer knows nothing about any particular one."""

from meshlm.objectives.base import Objective
from meshlm.objectives.pretrain import NextTokenObjective

OBJECTIVES = {"pretrain": NextTokenObjective}


def build_objective(name: str) -> Objective:
    return OBJECTIVES[name]()


__all__ = ["Objective", "NextTokenObjective", "OBJECTIVES", "build_objective"]
