"""Loading a checkpoint for inference and inspection (model only, on one device)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from meshlm.checkpoint.manager import find_latest_valid, read_train_state, verify_checkpoint
from meshlm.config.loader import load_config
from meshlm.config.schema import JobConfig
from meshlm.errors import CheckpointError


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
    ``generates=True``: refuse a model without a vocabulary head (a reward model's score head cannot generate)."""
    from meshlm.train.model_setup import rebuild_on_device

    ckpt = resolve_checkpoint(path)
    cfg = load_config(ckpt / "config.toml")
    # Post-training checkpoints rebuild what their objective and LoRA changed (a score head; base + adapters).
    model = rebuild_on_device(ckpt, cfg, torch.device(device))
    if generates and model.output.out_features != cfg.model.vocab_size:
        raise CheckpointError(f"{ckpt} is a {cfg.training.objective} model with {model.output.out_features} "
                              f"output(s), not a vocabulary head (a reward model's score head): it scores sequences "
                              "and cannot generate; pass a policy checkpoint")
    return model, cfg, read_train_state(ckpt), ckpt
