"""Random-weight checkpoints for serving tests and benchmarks: the server, registry and batching do not care what
the weights learned, and building these takes about a second where a training run takes minutes."""

from __future__ import annotations

from pathlib import Path

import torch

from meshlm.checkpoint.load import load_lora_base, resolve_checkpoint
from meshlm.checkpoint.manager import CheckpointManager
from meshlm.config.loader import config_to_toml, load_config
from meshlm.data import embedded_documents
from meshlm.models import build_model
from meshlm.models.build import adapt_meta_model, meta_model
from meshlm.models.init import materialize
from meshlm.models.lora import lora_modules
from meshlm.objectives import build_objective
from meshlm.tokenizer import MeshTokenizer


def random_checkpoints(root: str | Path, flavor: str = "debug", vocab_size: int = 512,
                       steps: tuple[int, ...] = (1, 2)) -> list[Path]:
    """One checkpoint per step under ``root/checkpoints`` (different seeds, so different weights) of ``flavor``
    with a byte-level BPE tokenizer of ``vocab_size`` tokens trained on 200 embedded documents."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = MeshTokenizer.train(embedded_documents()[:200], vocab_size)
    tokenizer.save(root / "tokenizer.json")
    cfg = load_config(None, [f"model.flavor={flavor}", f"model.vocab_size={tokenizer.vocab_size}"])
    manager = CheckpointManager(root, keep_last=len(steps))
    return [manager.save(step, [build_model(cfg.model, "cpu", seed=step)], None, {"step": step},
                         config_to_toml(cfg), {"tokenizer.json": root / "tokenizer.json"}) for step in steps]


def random_adapter(base: str | Path, root: str | Path, seed: int, rank: int = 4, alpha: float = 8.0,
                   targets: tuple[str, ...] = ("q", "v", "down"), scale: float = 0.05) -> Path:
    """A LoRA checkpoint over the checkpoint ``base`` (``checkpoint.init_from``) whose B matrices are random
    (normal, ``scale``), not zero as after initialisation, so the adapter changes the model's output."""
    base = resolve_checkpoint(base)
    cfg = load_config(base / "config.toml", ["training.objective=sft", f"checkpoint.init_from={base}",
                                             f"lora.rank={rank}", f"lora.alpha={alpha}",
                                             f"lora.targets={','.join(targets)}", f"training.seed={seed}"])
    model = meta_model(cfg.model)
    adapt_meta_model(model, build_objective(cfg.training.objective, cfg.objective), cfg.lora)
    materialize(model, "cpu", seed)
    load_lora_base(cfg, [model])
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, module in sorted(lora_modules(model).items()):
            module.lora_B.copy_(torch.randn(module.lora_B.shape, generator=generator) * scale)
    manager = CheckpointManager(Path(root), keep_last=1)
    return manager.save(1, [model], None, {"step": 1, "lora_base": str(base)}, config_to_toml(cfg),
                        {"tokenizer.json": base / "tokenizer.json"})
