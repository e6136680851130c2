"""The rule judge's rules (judges/rule.py): regular expressions that give each clause of a response a role, and
the decision that turns the roles into a label. Frozen as the baseline (no tuning to new labelled sets); see
:mod:`.decide` for how the groups fit together."""

from meshlm.safety.rules.decide import Analysis, Clause, analyse, decide

__all__ = ["Analysis", "Clause", "analyse", "decide"]
