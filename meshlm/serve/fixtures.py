"""Random-weight checkpoints for serving tests and benchmarks: the server, registry and batching do not care what
the weights learned, and building these takes about a second where a training run takes minutes."""

from __future__ import annotations

from pathlib import Path


def random_checkpoints(root: str | Path, flavor: str = "debug", vocab_size: int = 512,
                       steps: tuple[int, ...] = (1, 2)) -> list[Path]:
    """One checkpoint per step under ``root/checkpoints`` (different seeds, so different weights) of ``flavor``
    with a byte-level BPE tokenizer of ``vocab_size`` tokens trained on 200 embedded documents."""
    from meshlm.checkpoint.manager import CheckpointManager
    from meshlm.config.loader import config_to_toml, load_config
    from meshlm.data import embedded_documents
    from meshlm.models import build_model
    from meshlm.tokenizer import MeshTokenizer

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = MeshTokenizer.train(embedded_documents()[:200], vocab_size)
    tokenizer.save(root / "tokenizer.json")
    cfg = load_config(None, [f"model.flavor={flavor}", f"model.vocab_size={tokenizer.vocab_size}"])
    manager = CheckpointManager(root, keep_last=len(steps))
    return [manager.save(step, [build_model(cfg.model, "cpu", seed=step)], None, {"step": step},
                         config_to_toml(cfg), {"tokenizer.json": root / "tokenizer.json"}) for step in steps]
