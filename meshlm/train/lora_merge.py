"""A LoRA run merged into a full checkpoint: each adapted weight becomes W + (α / r) · B A.

A LoRA checkpoint holds only its adapters and names its base (``checkpoint.init_from``); anything that starts
from it as from a full model — the next training stage's ``init_from``, a DPO run's frozen reference — would
have to rebuild base + adapters first. The merged checkpoint is an ordinary weights-only one (``lora.rank = 0``
in its config.toml, the adapters' tokenizer files beside it, ``merged_from`` in train_state.json): `generate`,
`convert`, `inspect` and ``init_from`` load it alone. Used by ``meshlm align`` (``sft.lora_rank``,
``dpo.lora_rank``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torch import nn

from meshlm.checkpoint.load import model_from_checkpoint, resolve_checkpoint
from meshlm.checkpoint.manager import CheckpointManager, find_latest_valid, read_train_state
from meshlm.config.loader import config_to_toml
from meshlm.errors import CheckpointError
from meshlm.fileio import atomic_write_text
from meshlm.models.lora import lora_modules, merge_lora
from meshlm.train.run_dir import RESOLVED

# Files of a checkpoint folder that belong to that checkpoint alone; the others (the tokenizer, its chat
# template) travel to the merged one.
_OWN_FILES = {"train_state.json", "config.toml", "manifest.json"}


def merge_lora_checkpoint(source: str | Path, out: str | Path) -> Path:
    """Write ``source`` (a LoRA run directory or step folder) merged into the run directory ``out`` (its
    config.resolved.toml and checkpoints/step-N/, N the source's step); returns the step folder."""
    model, cfg, state, ckpt = model_from_checkpoint(source)
    if not cfg.lora.enabled:
        raise CheckpointError(f"{ckpt} is not a LoRA checkpoint (lora.rank = 0): there are no adapters to merge")
    merge_lora(model)
    _plain_linears(model)
    job = dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, rank=0))
    toml = config_to_toml(job)
    files = {p.name: p for p in sorted(ckpt.iterdir()) if p.is_file() and p.name not in _OWN_FILES}
    merged_state = {"tokens_seen": state.get("tokens_seen", 0), "merged_from": str(ckpt.resolve()),
                    "lora": dataclasses.asdict(cfg.lora)}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / RESOLVED, toml)
    return CheckpointManager(out, keep_last=1).save(int(state["step"]), [model], None, merged_state, toml,
                                                    extra_files=files)


def merged_is_current(source: str | Path, out: str | Path) -> bool:
    """Whether ``out`` holds a valid merge of ``source``'s newest checkpoint (a resumed pipeline reuses it)."""
    found = find_latest_valid(Path(out) / "checkpoints", warn=lambda msg: None)
    return found is not None and read_train_state(found).get("merged_from") == str(resolve_checkpoint(source).resolve())


def _plain_linears(model: nn.Module) -> None:
    """Replace every (merged) LoRA layer by an ``nn.Linear`` holding the same weight and bias, so the state dict
    has the base model's keys only."""
    for name, module in lora_modules(model).items():
        parent, _, child = name.rpartition(".")
        plain = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None, device="meta")
        plain.weight, plain.bias = module.weight, module.bias
        setattr(model.get_submodule(parent), child, plain)
