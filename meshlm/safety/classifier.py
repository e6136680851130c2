"""Reward-model-style text classifiers: a meshlm decoder trunk with a class head over refuse / warn / answer.

The model is the ``classify`` objective's (objectives/classify.py): as the reward model, the vocabulary head is
replaced by a small linear head read at each sequence's last real token (right padding: position
``length − 1``, the eos), here with 3 outputs trained by cross-entropy. Two users:

- :class:`TrainedJudge` labels (prompt, response) pairs, trained on labelled responses;
- :class:`~meshlm.safety.guard.Guard` classes prompts and (prompt, response) turns.

Training is a run of the one Trainer (:meth:`TextClassifier.train`: single process, CPU, fp32, in a temporary
run directory) with ``training.objective = "classify"`` on the examples written as labelled rows. The trunk is
either a fresh tiny decoder with a byte-level BPE tokenizer trained on the training texts (no download, seconds
on a CPU), written as a step-0 checkpoint for ``checkpoint.init_from``, or a meshlm checkpoint (``trunk=RUN``:
its weights and tokenizer). Inputs are plain text, ``"User: <prompt>\\nAssistant: <response>"`` + eos, so any
tokenizer works; a long response keeps its start and its end, a long prompt its end
(data/posttrain/labelled.py).

Saved as a folder: ``classifier.json`` (kind, labels, model shape, training figures), ``tokenizer.json``,
``model.safetensors``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from meshlm.checkpoint.load import resolve_checkpoint
from meshlm.checkpoint.manager import CheckpointManager
from meshlm.config.loader import build_config, config_to_toml, inherit_init_from, load_config
from meshlm.data.posttrain.labelled import classifier_ids, classifier_text
from meshlm.errors import DataError
from meshlm.fileio import atomic_write_text
from meshlm.models import ModelConfig, build_model
from meshlm.models.config import CUSTOM_FLAVOR
from meshlm.objectives.classify import add_class_head, last_token_logits
from meshlm.safety.rules import decide
from meshlm.safety.taxonomy import POLICIES as LABELS  # the head's classes: unclear is labelled before it
from meshlm.tokenizer import MeshTokenizer
from meshlm.train.callbacks import TrainerCallback
from meshlm.train.run_dir import init_run_dir
from meshlm.train.trainer import Trainer

FORMAT_VERSION = 1


@dataclass
class ClassifierConfig:
    """Shape and training of a classifier. The defaults train in seconds on 2 CPU cores."""

    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_hidden_dim: int = 128
    vocab_size: int = 1024
    max_len: int = 128  # tokens per input, eos included
    prompt_tokens: int = 32  # at most this many of them for the prompt (its end)
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 0


class TextClassifier:
    """A decoder trunk + a (dim -> len(LABELS)) head; inputs are (prompt, response-or-None) pairs."""

    def __init__(self, model: nn.Module, tokenizer, max_len: int, prompt_tokens: int) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_len, self.prompt_tokens = max_len, prompt_tokens

    # ---- encoding -------------------------------------------------------------------------------------
    def encode(self, prompt: str, response: str | None = None) -> list[int]:
        return classifier_ids(self.tokenizer, prompt, response, self.max_len, self.prompt_tokens)

    def _batch(self, encoded: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(e) for e in encoded)
        pad = self.tokenizer.pad_id if self.tokenizer.pad_id is not None else self.tokenizer.eos_id
        ids = torch.full((len(encoded), width), pad, dtype=torch.long)
        for row, e in enumerate(encoded):
            ids[row, :len(e)] = torch.tensor(e)
        return ids, torch.tensor([len(e) for e in encoded])

    @torch.no_grad()
    def probabilities(self, pairs: Sequence[tuple[str, str | None]], batch_size: int = 64) -> torch.Tensor:
        """(N, C) class probabilities."""
        self.model.eval()
        out = []
        for start in range(0, len(pairs), batch_size):
            encoded = [self.encode(p, r) for p, r in pairs[start:start + batch_size]]
            out.append(torch.softmax(last_token_logits(self.model, *self._batch(encoded)), dim=-1))
        return torch.cat(out) if out else torch.zeros(0, len(LABELS))

    def predict(self, pairs: Sequence[tuple[str, str | None]]) -> list[str]:
        return [LABELS[i] for i in self.probabilities(pairs).argmax(-1).tolist()]

    # ---- training -------------------------------------------------------------------------------------
    @classmethod
    def train(cls, pairs: Sequence[tuple[str, str | None]], targets: Sequence[str], cfg: ClassifierConfig,
              trunk: str | Path | None = None) -> tuple["TextClassifier", dict]:
        """Fit on (pair, label) examples with the Trainer (module docstring); returns the classifier and its
        training figures."""
        if not pairs or len(pairs) != len(targets):
            raise DataError(f"a classifier needs labelled examples; got {len(pairs)} inputs, {len(targets)} labels")
        bad = sorted({t for t in targets if t not in LABELS})
        if bad:
            raise DataError(f"labels {bad} are not among {', '.join(LABELS)}")
        with tempfile.TemporaryDirectory(prefix="meshlm-classifier-") as tmp:
            folder = Path(tmp)
            init_from, source = _trunk(pairs, cfg, trunk, folder / "trunk")
            rows = folder / "rows.jsonl"
            rows.write_text("".join(json.dumps({"prompt": p, "label": t, **({} if r is None else {"response": r})})
                                    + "\n" for (p, r), t in zip(pairs, targets)), encoding="utf-8")
            job = _job(cfg, init_from, rows)
            losses, start = _StepLosses(), time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):  # the run's log lines: the callers report figures
                init_run_dir(folder / "run", config_to_toml(job), resume=False)
                trainer = Trainer(job, folder / "run", callbacks=[losses])
                trainer.train()
            seconds = time.perf_counter() - start
            model = build_model(job.model, "cpu", seed=cfg.seed)
            add_class_head(model, len(LABELS))
            model.load_state_dict(trainer.model.state_dict())
            clf = cls(model, trainer.hooks.data.tokenizer, cfg.max_len, cfg.prompt_tokens)
        predicted = clf.predict(pairs)
        accuracy = sum(p == t for p, t in zip(predicted, targets)) / len(targets)
        tail = losses.values[-20:]
        return clf, {"examples": len(pairs), "steps": cfg.steps, "final_loss": sum(tail) / len(tail),
                     "train_accuracy": accuracy, "seconds": round(seconds, 2), "trunk": source}

    # ---- files ----------------------------------------------------------------------------------------
    def save(self, folder: str | Path, kind: str, extra: dict | None = None) -> Path:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(folder / "tokenizer.json")
        state = {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}
        save_file(state, str(folder / "model.safetensors"))
        meta = {"format": FORMAT_VERSION, "kind": kind, "labels": list(LABELS), "max_len": self.max_len,
                "prompt_tokens": self.prompt_tokens, "model": dataclasses.asdict(self.model.cfg), **(extra or {})}
        atomic_write_text(folder / "classifier.json", json.dumps(meta, indent=2) + "\n")  # written last
        return folder

    @classmethod
    def load(cls, folder: str | Path, kind: str) -> tuple["TextClassifier", dict]:
        from safetensors.torch import load_file

        folder = Path(folder)
        meta_path = folder / "classifier.json"
        if not meta_path.is_file():
            raise DataError(f"{folder} is not a saved {kind} (no classifier.json); train one first")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("kind") != kind or meta.get("labels") != list(LABELS):
            raise DataError(f"{folder} holds a {meta.get('kind')!r} classifier over {meta.get('labels')}, not a "
                            f"{kind} over {list(LABELS)}")
        model = build_model(ModelConfig(**meta["model"]), "cpu", seed=0)
        add_class_head(model, len(LABELS))
        model.load_state_dict(load_file(str(folder / "model.safetensors")))
        tokenizer = MeshTokenizer.load(folder / "tokenizer.json")
        return cls(model, tokenizer, meta["max_len"], meta["prompt_tokens"]), meta


class _StepLosses(TrainerCallback):
    """Keeps every step's loss (the training figures' ``final_loss``)."""

    def __init__(self) -> None:
        self._losses: list[torch.Tensor] = []

    def on_step_end(self, view: Any, record: dict[str, Any]) -> None:
        self._losses.append(record["loss"])

    @property
    def values(self) -> list[float]:
        return [float(loss) for loss in self._losses]


def _job(cfg: ClassifierConfig, init_from: Path, rows: Path):
    """The Trainer's config: the classify objective over refuse / warn / answer, ClassifierConfig's optimiser
    and schedule (warm-up over 20 steps, then a linear decay to 0.1× the peak), fp32 on the CPU, no
    checkpoints and no held-out split (the classifier is saved by :meth:`TextClassifier.save`)."""
    raw: dict[str, Any] = {
        "data": {"path": str(rows), "seq_len": cfg.max_len},
        "optimizer": {"lr": cfg.lr, "weight_decay": cfg.weight_decay, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
        "schedule": {"name": "wsd", "warmup_steps": 20, "min_lr_ratio": 0.1, "decay_fraction": 1.0},
        "training": {"objective": "classify", "steps": cfg.steps, "batch_size": cfg.batch_size, "seed": cfg.seed,
                     "precision": "fp32", "device": "cpu", "max_grad_norm": 1.0, "eval_interval": 0},
        "checkpoint": {"init_from": str(init_from), "enabled": False},
        "metrics": {"interval": 50, "tensorboard": False, "progress": "plain"},
        "objective": {"classes": list(LABELS), "prompt_tokens": cfg.prompt_tokens},
    }
    return build_config(inherit_init_from(raw))


def _trunk(pairs: Sequence[tuple[str, str | None]], cfg: ClassifierConfig, trunk: str | Path | None,
           folder: Path) -> tuple[Path, str]:
    """(the checkpoint the classifier starts from, what to record as its trunk): ``trunk``, else a fresh tiny
    decoder and a tokenizer trained on the texts, written under ``folder`` as a step-0 checkpoint."""
    if trunk is not None:
        ckpt = resolve_checkpoint(trunk)
        job = load_config(ckpt / "config.toml")
        if job.training.objective == "reward" or job.lora.enabled:
            raise DataError(f"trunk {ckpt}: use a plain (pretrained or SFT) checkpoint without LoRA adapters")
        if cfg.max_len > job.model.max_seq_len:
            raise DataError(f"trunk {ckpt}: max_len {cfg.max_len} exceeds its model.max_seq_len "
                            f"{job.model.max_seq_len}")
        return ckpt, str(ckpt)
    torch.manual_seed(cfg.seed)
    texts = ["".join(classifier_text(p, r)) for p, r in pairs]
    tokenizer = MeshTokenizer.train(texts, cfg.vocab_size)
    shape = {"flavor": CUSTOM_FLAVOR, "dim": cfg.dim, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
             "n_kv_heads": cfg.n_kv_heads, "ffn_hidden_dim": cfg.ffn_hidden_dim,
             "vocab_size": tokenizer.vocab_size, "max_seq_len": cfg.max_len}
    job = build_config({"model": shape, "data": {"seq_len": cfg.max_len}, "training": {"seed": cfg.seed}})
    folder.mkdir(parents=True)
    tokenizer.save(folder / "tokenizer.json")
    model = build_model(job.model, "cpu", seed=cfg.seed)
    path = CheckpointManager(folder, keep_last=1).save(0, [model], None, {"tokens_seen": 0}, config_to_toml(job),
                                                       extra_files={"tokenizer.json": folder / "tokenizer.json"})
    return path, "fresh"


def role_features(prompt: str, response: str) -> str:
    """The response prefixed with the rule judge's clause roles ("[refusal offer alternative] ..."), so that a
    trained judge can lean on structure the rules recognise beyond the synthesis templates."""
    label, analysis = decide(response, prompt)
    roles: list[str] = []
    for c in analysis.clauses:
        role = c.role + ("+verdict" if c.verdict else "") + ("+refers" if c.refers and c.role != "referral" else "")
        if not roles or roles[-1] != role:
            roles.append(role)
    return f"[{' '.join(roles) or 'empty'}] {response}"
