"""The objectives a config may name, one line each: ``training.objective`` value -> "module:Class".

This is the registration of an objective (its module holds everything else: its data kind, the [objective] keys
it reads, its hooks). Kept here, torch-free, so that the config layer checks ``training.objective`` and
`meshlm config keys` lists the names without importing any objective; meshlm/objectives imports the class on
use (:func:`meshlm.objectives.build_objective`).
"""

from __future__ import annotations

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
