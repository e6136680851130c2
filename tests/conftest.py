"""Shared fixtures: a session-wide cache for the embedded corpus, so tests never touch ~/.cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def meshlm_cache(tmp_path_factory) -> Path:
    """MESHLM_CACHE for the whole session (also inherited by CLI subprocesses)."""
    cache = Path(os.environ.get("MESHLM_TEST_CACHE") or tmp_path_factory.mktemp("meshlm-cache"))
    old = os.environ.get("MESHLM_CACHE")
    os.environ["MESHLM_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("MESHLM_CACHE", None)
    else:
        os.environ["MESHLM_CACHE"] = old


@pytest.fixture(scope="session")
def debug_dataset(meshlm_cache) -> Path:
    """The embedded corpus prepared at the `debug` flavour's vocabulary (once per session)."""
    from meshlm.data import ensure_embedded_dataset
    from meshlm.models import flavor_config

    return ensure_embedded_dataset(meshlm_cache, flavor_config("debug").vocab_size, num_workers=2)


@pytest.fixture(scope="session")
def tiny_run(debug_dataset, tmp_path_factory) -> Path:
    """A real two-step `debug` training run on the embedded corpus with checkpoints at steps 1 and 2 (its text
    is noise): what the safety, registry and serving tests load, register and serve. Read it, never write it."""
    from meshlm.config.loader import config_to_toml, load_config
    from meshlm.train.run_dir import init_run_dir
    from meshlm.train.trainer import Trainer

    cfg = load_config(None, [f'data.path="{debug_dataset}"', "data.seq_len=32", "training.batch_size=4",
                             "training.steps=2", "training.eval_interval=0", "checkpoint.interval=1",
                             "metrics.interval=1", "metrics.progress=plain", "metrics.tensorboard=false"])
    run = tmp_path_factory.mktemp("tiny-run") / "run"
    init_run_dir(run, config_to_toml(cfg), resume=False)
    Trainer(cfg, run).train()
    return run
