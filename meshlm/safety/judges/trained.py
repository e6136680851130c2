"""The trained judge: a tiny meshlm decoder with a class head (classifier.py), trained in seconds on a CPU.

``--judge trained:DIR`` loads one; ``meshlm judge --train-judge ROWS --out DIR [--steps N] [--trunk RUN]`` trains
one (the default trainer). Its head has three classes; degenerate text is labelled before it (base.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping, Sequence

from meshlm.errors import ConfigError
from meshlm.safety.judges import register
from meshlm.safety.judges.base import Flag, Judge, Log
from meshlm.safety.taxonomy import UNCLEAR


@register
class TrainedJudge(Judge):
    """A judge learned from labelled responses ``{prompt, response, label}`` (e.g. ``meshlm align data``'s
    labelled_responses.jsonl). ``features="roles"`` prefixes each response with the rule judge's clause roles
    (classifier.role_features); the default reads the text alone."""

    kind = "trained"
    arg = "DIR"
    summary = "a tiny decoder with a class head, trained on labelled responses"
    train_flags = (Flag("--steps", "training steps of the tiny classifier (default 300)", int),
                   Flag("--trunk", "start the classifier from this meshlm checkpoint (its weights and tokenizer)"))

    def __init__(self, classifier, meta: dict, path: str | None = None) -> None:
        self.classifier, self.meta = classifier, meta
        self.name = f"trained:{path}" if path else "trained"
        self.features = meta.get("features", "text")

    def _response(self, prompt: str, response: str) -> str:
        from meshlm.safety.classifier import role_features

        return role_features(prompt, response) if self.features == "roles" else response

    @classmethod
    def fit(cls, rows: Sequence[dict], cfg=None, steps: int | None = None, trunk: str | Path | None = None,
            features: str = "text") -> "TrainedJudge":
        from meshlm.safety.classifier import ClassifierConfig, TextClassifier, role_features

        if features not in ("text", "roles"):
            raise ValueError(f"features must be 'text' or 'roles', not {features!r}")
        cfg = cfg or ClassifierConfig()
        if steps is not None:
            cfg = dataclasses.replace(cfg, steps=steps)
        pairs = [(str(r.get("prompt", "")), str(r["response"])) for r in rows]
        if features == "roles":
            pairs = [(p, role_features(p, r)) for p, r in pairs]
        clf, stats = TextClassifier.train(pairs, [r["label"] for r in rows], cfg, trunk)
        return cls(clf, {"training": stats, "config": dataclasses.asdict(cfg), "features": features})

    def classify(self, prompts: Sequence[str], responses: Sequence[str]) -> list[str]:
        return self.classifier.predict([(p, self._response(p, r)) for p, r in zip(prompts, responses)])

    def save(self, folder: str | Path) -> Path:
        return self.classifier.save(folder, "judge", self.meta)

    @classmethod
    def load(cls, arg: str, options: Mapping[str, Any] | None = None) -> "TrainedJudge":
        from meshlm.safety.classifier import TextClassifier

        clf, meta = TextClassifier.load(arg, "judge")
        return cls(clf, meta, str(arg))

    @classmethod
    def train(cls, rows: list[dict], options: Mapping[str, Any], out: str, log: Log) -> dict[str, Any]:
        from meshlm.safety.classifier import ClassifierConfig

        steps = 300 if options.get("steps") is None else options["steps"]
        if steps < 1:
            raise ConfigError(f"--steps must be >= 1, got {steps}")
        kept = [row for row in rows if row["label"] != UNCLEAR]  # the head has three classes
        if len(kept) < len(rows):
            log(f"left out {len(rows) - len(kept)} rows labelled unclear (degenerate text is labelled before the "
                "judge's head)")
        log(f"training a judge on {len(kept)} rows ({steps} steps)")
        judge = cls.fit(kept, ClassifierConfig(steps=steps), trunk=options.get("trunk"))
        return {"kind": "judge", "out": str(judge.save(out)), **judge.meta["training"]}
