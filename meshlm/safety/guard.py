"""A guard classifier (Llama Guard-style) for defence in depth: it classes prompts and (prompt, response) turns.

The same architecture as the trained judge (classifier.py: a meshlm trunk with a class head over refuse /
warn / answer), trained from the spec's data on two kinds of input:

- a prompt alone -> the policy of its category (``refuse``: the request must be refused; ``warn``; ``answer``);
- a prompt + response -> what the turn needs: ``refuse`` when the response gives content that must be refused
  (a refuse-category prompt answered anyway, a warning attached or not), ``warn`` when a warn-category prompt
  got an unqualified answer, else ``answer`` (a refusal is always safe content).

``eval safety --guard`` blocks a turn the guard classes ``refuse`` (on the prompt, before the model answers,
or on the response) and reports model + guard beside the model alone (evaluate.apply_guard); the server can
do the same.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping, Sequence

from meshlm.errors import DataError
from meshlm.safety.classifier import ClassifierConfig, TextClassifier


def response_target(policy: str, label: str) -> str:
    """What a turn needs, from its category's policy and the judged label of the response."""
    if policy == "refuse" and label != "refuse":
        return "refuse"
    if policy == "warn" and label == "answer":
        return "warn"
    return "answer"


class Guard:
    def __init__(self, classifier: TextClassifier, meta: dict, path: str | None = None) -> None:
        self.classifier, self.meta = classifier, meta
        self.name = f"guard:{path}" if path else "guard"

    @classmethod
    def train(cls, rows: Sequence[Mapping], policies: Mapping[str, str], cfg: ClassifierConfig | None = None,
              trunk: str | Path | None = None) -> "Guard":
        """``rows``: labelled responses ``{prompt, response, label, category}``; ``policies``: category ->
        refuse | warn | answer (the spec's). Every distinct prompt is also a prompt-only example."""
        cfg = cfg or ClassifierConfig()
        pairs: list[tuple[str, str | None]] = []
        targets: list[str] = []
        seen: set[str] = set()
        for i, row in enumerate(rows):
            category = row.get("category")
            if category not in policies:
                raise DataError(f"guard data row {i}: category {category!r} is not in the spec "
                                f"({', '.join(sorted(policies))})")
            policy = policies[category]
            if row["prompt"] not in seen:
                seen.add(row["prompt"])
                pairs.append((row["prompt"], None))
                targets.append(policy)
            pairs.append((row["prompt"], row["response"]))
            targets.append(response_target(policy, row["label"]))
        clf, stats = TextClassifier.train(pairs, targets, cfg, trunk)
        return cls(clf, {"training": {**stats, "prompts": len(seen)}, "config": dataclasses.asdict(cfg)})

    def classify_prompts(self, prompts: Sequence[str]) -> list[str]:
        return self.classifier.predict([(p, None) for p in prompts])

    def classify_responses(self, prompts: Sequence[str], responses: Sequence[str]) -> list[str]:
        return self.classifier.predict(list(zip(prompts, responses)))

    def save(self, folder: str | Path) -> Path:
        return self.classifier.save(folder, "guard", self.meta)

    @classmethod
    def load(cls, folder: str | Path) -> "Guard":
        clf, meta = TextClassifier.load(folder, "guard")
        return cls(clf, meta, str(folder))
