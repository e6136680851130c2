"""Reward-model-style text classifiers: a meshlm decoder trunk with a class head over refuse / warn / answer.

As the reward model (objectives/reward.py), the vocabulary head is replaced by a small linear head read at each
sequence's last real token (right padding: position ``length − 1``, the eos), here with 3 outputs trained by
cross-entropy instead of 1 output trained by Bradley–Terry. Two users:

- :class:`TrainedJudge` labels (prompt, response) pairs, trained on labelled responses;
- :class:`~meshlm.safety.guard.Guard` classes prompts and (prompt, response) turns.

The trunk is either a fresh tiny decoder with a byte-level BPE tokenizer trained on the training texts (no
download, seconds on a CPU), or a meshlm checkpoint (``trunk=RUN``: its weights and tokenizer). Inputs are plain
text, ``"User: <prompt>\\nAssistant: <response>"`` + eos, so any tokenizer works. A long response keeps its
start and its end (refusals open a response, referrals close it); a long prompt keeps its end.

Saved as a folder: ``classifier.json`` (kind, labels, model shape, training figures), ``tokenizer.json``,
``model.safetensors``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from meshlm.errors import DataError
from meshlm.safety.taxonomy import POLICIES as LABELS  # the head's classes: unclear is labelled before it

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


def _format(prompt: str, response: str | None) -> tuple[str, str]:
    return f"User: {prompt}\n", ("" if response is None else f"Assistant: {response}")


class TextClassifier:
    """A decoder trunk + a (dim -> len(LABELS)) head; inputs are (prompt, response-or-None) pairs."""

    def __init__(self, model: nn.Module, tokenizer, max_len: int, prompt_tokens: int) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_len, self.prompt_tokens = max_len, prompt_tokens

    # ---- encoding -------------------------------------------------------------------------------------
    def encode(self, prompt: str, response: str | None = None) -> list[int]:
        tok = self.tokenizer
        head = [tok.bos_id] if tok.bos_id is not None else []
        p_text, r_text = _format(prompt, response)
        budget = self.max_len - len(head) - 1  # the eos closes every input
        p_ids = tok.encode(p_text)
        r_ids = tok.encode(r_text) if r_text else []
        p_keep = min(len(p_ids), max(self.prompt_tokens, budget - len(r_ids)))
        p_ids = p_ids[len(p_ids) - p_keep:]
        room = budget - len(p_ids)
        if len(r_ids) > room:  # keep the response's start and end
            r_ids = r_ids[:room - room // 2] + r_ids[len(r_ids) - room // 2:]
        return head + p_ids + r_ids + [tok.eos_id]

    def _batch(self, encoded: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(e) for e in encoded)
        pad = self.tokenizer.pad_id if self.tokenizer.pad_id is not None else self.tokenizer.eos_id
        ids = torch.full((len(encoded), width), pad, dtype=torch.long)
        for row, e in enumerate(encoded):
            ids[row, :len(e)] = torch.tensor(e)
        return ids, torch.tensor([len(e) for e in encoded])

    def forward_logits(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, T) right-padded ids -> (B, C) class logits at each row's last real token (causal attention:
        the pads after it are never seen)."""
        out = self.model(ids)  # (B, T, C)
        return out[torch.arange(ids.shape[0]), lengths - 1].float()  # (B, C)

    @torch.no_grad()
    def probabilities(self, pairs: Sequence[tuple[str, str | None]], batch_size: int = 64) -> torch.Tensor:
        """(N, C) class probabilities."""
        self.model.eval()
        out = []
        for start in range(0, len(pairs), batch_size):
            encoded = [self.encode(p, r) for p, r in pairs[start:start + batch_size]]
            out.append(torch.softmax(self.forward_logits(*self._batch(encoded)), dim=-1))
        return torch.cat(out) if out else torch.zeros(0, len(LABELS))

    def predict(self, pairs: Sequence[tuple[str, str | None]]) -> list[str]:
        return [LABELS[i] for i in self.probabilities(pairs).argmax(-1).tolist()]

    # ---- training -------------------------------------------------------------------------------------
    @classmethod
    def train(cls, pairs: Sequence[tuple[str, str | None]], targets: Sequence[str], cfg: ClassifierConfig,
              trunk: str | Path | None = None) -> tuple["TextClassifier", dict]:
        """Fit on (pair, label) examples; returns the classifier and its training figures."""
        if not pairs or len(pairs) != len(targets):
            raise DataError(f"a classifier needs labelled examples; got {len(pairs)} inputs, {len(targets)} labels")
        bad = sorted({t for t in targets if t not in LABELS})
        if bad:
            raise DataError(f"labels {bad} are not among {', '.join(LABELS)}")
        torch.manual_seed(cfg.seed)
        model, tokenizer, source = _trunk(pairs, cfg, trunk)
        clf = cls(model, tokenizer, cfg.max_len, cfg.prompt_tokens)
        encoded = [clf.encode(p, r) for p, r in pairs]
        y = torch.tensor([LABELS.index(t) for t in targets])
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) *
                                                  max(0.1, 1 - s / max(1, cfg.steps)))
        gen = torch.Generator().manual_seed(cfg.seed)
        order, pos, losses, start = torch.randperm(len(encoded), generator=gen), 0, [], time.perf_counter()
        model.train()
        for _ in range(cfg.steps):
            if pos + cfg.batch_size > len(order):
                order, pos = torch.randperm(len(encoded), generator=gen), 0
            idx = order[pos:pos + cfg.batch_size].tolist()
            pos += cfg.batch_size
            logits = clf.forward_logits(*clf._batch([encoded[i] for i in idx]))
            loss = F.cross_entropy(logits, y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
        model.eval()
        seconds = time.perf_counter() - start
        predicted = clf.predict(pairs)
        accuracy = sum(p == t for p, t in zip(predicted, targets)) / len(targets)
        tail = losses[-20:]
        return clf, {"examples": len(pairs), "steps": cfg.steps, "final_loss": sum(tail) / len(tail),
                     "train_accuracy": accuracy, "seconds": round(seconds, 2), "trunk": source}

    # ---- files ----------------------------------------------------------------------------------------
    def save(self, folder: str | Path, kind: str, extra: dict | None = None) -> Path:
        from safetensors.torch import save_file

        from meshlm.fileio import atomic_write_text

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

        from meshlm.models import ModelConfig, build_model
        from meshlm.tokenizer import MeshTokenizer

        folder = Path(folder)
        meta_path = folder / "classifier.json"
        if not meta_path.is_file():
            raise DataError(f"{folder} is not a saved {kind} (no classifier.json); train one first")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("kind") != kind or meta.get("labels") != list(LABELS):
            raise DataError(f"{folder} holds a {meta.get('kind')!r} classifier over {meta.get('labels')}, not a "
                            f"{kind} over {list(LABELS)}")
        model = build_model(ModelConfig(**{**meta["model"], "vocab_size": meta["model"]["vocab_size"]}), "cpu",
                            seed=0)
        _add_class_head(model)
        model.load_state_dict(load_file(str(folder / "model.safetensors")))
        tokenizer = MeshTokenizer.load(folder / "tokenizer.json")
        return cls(model, tokenizer, meta["max_len"], meta["prompt_tokens"]), meta


def _add_class_head(model: nn.Module) -> None:
    """Replace ``output`` (dim -> V) by an untied (dim -> len(LABELS)) head, as the reward model's score head."""
    model.cfg = dataclasses.replace(model.cfg, tie_embeddings=False)
    model.output = nn.Linear(model.cfg.dim, len(LABELS), bias=True)


def _trunk(pairs: Sequence[tuple[str, str | None]], cfg: ClassifierConfig, trunk: str | Path | None):
    from meshlm.models import ModelConfig, build_model
    from meshlm.tokenizer import MeshTokenizer

    if trunk is not None:
        from meshlm.checkpoint.load import model_from_checkpoint

        model, job, _, ckpt = model_from_checkpoint(trunk, "cpu")
        if job.training.objective == "reward" or job.lora.enabled:
            raise DataError(f"trunk {ckpt}: use a plain (pretrained or SFT) checkpoint without LoRA adapters")
        model.cfg = dataclasses.replace(model.cfg, max_seq_len=max(model.cfg.max_seq_len, cfg.max_len))
        tokenizer = MeshTokenizer.load(ckpt / "tokenizer.json")
        if cfg.max_len > job.model.max_seq_len:
            raise DataError(f"trunk {ckpt}: max_len {cfg.max_len} exceeds its model.max_seq_len "
                            f"{job.model.max_seq_len}")
        source = str(ckpt)
    else:
        texts = ["".join(_format(p, r)) for p, r in pairs]
        tokenizer = MeshTokenizer.train(texts, cfg.vocab_size)
        shape = ModelConfig(dim=cfg.dim, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                            ffn_hidden_dim=cfg.ffn_hidden_dim, vocab_size=tokenizer.vocab_size,
                            max_seq_len=cfg.max_len)
        model = build_model(shape, "cpu", seed=cfg.seed)
        source = "fresh"
    _add_class_head(model)
    return model, tokenizer, source


def role_features(prompt: str, response: str) -> str:
    """The response prefixed with the rule judge's clause roles ("[refusal offer alternative] ..."), so that a
    trained judge can lean on structure the rules recognise beyond the synthesis templates."""
    from meshlm.safety.rules import decide

    label, analysis = decide(response, prompt)
    roles: list[str] = []
    for c in analysis.clauses:
        role = c.role + ("+verdict" if c.verdict else "") + ("+refers" if c.refers and c.role != "referral" else "")
        if not roles or roles[-1] != role:
            roles.append(role)
    return f"[{' '.join(roles) or 'empty'}] {response}"
