"""Loading a checkpoint's model: on one device for inference and inspection, or its weights into parts built
from its config (a frozen reference, a LoRA run's base).

A checkpoint's model is built as its run built it (meshlm/models/build.py: the meta model of its ``model.family``,
its objective's change, LoRA), then materialised and loaded; a LoRA checkpoint holds only its adapters, and its
base is ``checkpoint.init_from`` of its config. What its head is (``model.head``: lm, lm_value, score, classes)
is read from its config and checked against the built model; a checkpoint written before model.head gets the
head its build has.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from meshlm.checkpoint.manager import find_latest_valid, load_weights, read_train_state, verify_checkpoint
from meshlm.config.loader import load_config
from meshlm.config.schema import JobConfig
from meshlm.errors import CheckpointError
from meshlm.models.build import adapt_meta_model, meta_model
from meshlm.models.init import canonical_name, materialize
from meshlm.objectives import build_objective


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or the newest valid checkpoint of a run directory; verified either way."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint '{path}' does not exist; pass a run directory or a "
                              "RUN_DIR/checkpoints/step-XXXXXXXX folder")
    if (path / "manifest.json").exists() or path.name.startswith("step-"):
        reason = verify_checkpoint(path)
        if reason:
            raise CheckpointError(f"checkpoint {path} is not usable: {reason}")
        return path
    for root in (path / "checkpoints", path):
        found = find_latest_valid(root, warn=lambda msg: print(msg, flush=True))
        if found is not None:
            return found
    raise CheckpointError(f"no valid checkpoint found under '{path}'")


def weights_sha256(model: nn.Module) -> str:
    """sha256 over every model tensor in state-dict name order (sorted): name, dtype, shape, then raw bytes."""
    h = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        h.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return h.hexdigest()


def model_from_checkpoint(path: str | Path, device: str | torch.device = "cpu", *,
                          generates: bool = False) -> tuple[nn.Module, JobConfig, dict[str, Any], Path]:
    """(model in eval mode, the job config it was trained with, its train state, the checkpoint folder). A LoRA
    checkpoint comes back with its base (``checkpoint.init_from`` of its config) and its adapters, unmerged.
    ``model.cfg.head`` says what its head is. ``generates=True``: refuse a model without a vocabulary head (a
    reward model's score head, a classifier's class head cannot generate)."""
    ckpt = resolve_checkpoint(path)
    cfg = load_config(ckpt / "config.toml")
    # Post-training checkpoints rebuild what their objective and LoRA changed (a score head; base + adapters).
    model = rebuild_on_device(ckpt, cfg, torch.device(device))
    head = model.cfg.head
    if generates and head not in ("lm", "lm_value"):
        what = {"score": "a reward model's score head", "classes": "a classifier's class head"}.get(head, head)
        raise CheckpointError(f"{ckpt} has {what} ({model.output.out_features} output(s)), not a vocabulary head: "
                              "it scores or classifies sequences and cannot generate; pass a policy checkpoint")
    return model, cfg, read_train_state(ckpt), ckpt


def source_config(checkpoint: str | Path) -> tuple[Path, JobConfig]:
    """(the checkpoint folder, the job config it was trained with)."""
    path = resolve_checkpoint(checkpoint)
    return path, load_config(path / "config.toml")


@torch.no_grad()
def rebuild_on_device(path: Path, cfg: JobConfig, device: torch.device | str) -> nn.Module:
    """The model of a checkpoint on one device (generate, convert, inspect): adapted as its objective says, with
    base + adapters for a LoRA checkpoint."""
    written = cfg.model.head  # "" in checkpoints written before model.head
    model = meta_model(cfg.model)
    adapt_meta_model(model, build_objective(cfg.training.objective, cfg.objective), cfg.lora)  # sets model.head
    if written and written != model.cfg.head:
        raise CheckpointError(f"{path}: its config says model.head = '{written}' but training.objective "
                              f"'{cfg.training.objective}' builds a '{model.cfg.head}' head; the config was edited "
                              "by hand or belongs to another checkpoint")
    materialize(model, device, cfg.training.seed)
    load_checkpoint_weights(path, cfg, [model])
    return model.eval()


def load_checkpoint_weights(path: Path, cfg: JobConfig, parts: list[nn.Module]) -> None:
    """A checkpoint's weights into ``parts`` built from its ``cfg``: base + adapters for a LoRA checkpoint."""
    if cfg.lora.enabled:
        load_lora_base(cfg, parts)
        load_weights(path, parts, trainable_only=True)  # the adapters (and any new head)
    else:
        load_weights(path, parts)


def load_lora_base(cfg: JobConfig, parts: list[nn.Module]) -> Path:
    """Load the frozen base weights of a LoRA model from ``checkpoint.init_from``; returns the folder."""
    path = resolve_checkpoint(cfg.checkpoint.init_from)
    frozen = param_keys(parts, trainable=False)
    load_weights(path, parts, keep=frozen.__contains__)
    return path


def param_keys(parts: list[nn.Module], trainable: bool) -> set[str]:
    """State-dict keys of the (non-)trainable parameters of ``parts`` (wrapper prefixes removed)."""
    return {canonical_name(name).removeprefix("module.") for part in parts
            for name, p in part.named_parameters() if p.requires_grad == trainable}
