"""The judges' former home, kept so that callers written against it keep working: the judges are plug-ins of
:mod:`meshlm.safety.judges` now (``make_judge("rule" | "encoder:DIR" | "trained:DIR" | "llm:URL#MODEL")``)."""

from __future__ import annotations

from meshlm.safety.judges import Judge, make_judge
from meshlm.safety.judges.rule import RuleJudge

__all__ = ["Judge", "RuleJudge", "make_judge"]
