"""Shared fixtures: a session-wide cache for the embedded corpus, so tests never touch ~/.cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import once_per_session

# Modules whose tests read what earlier tests of the module did (a module-scoped server whose audit log the last
# test checks) must run whole on one xdist worker. `--dist worksteal` gives each worker a contiguous half of the
# collection and, when one runs dry, moves tests from the *end* of the other's queue; the first tests of a queue
# are running by then. So these modules go first in the collection, where no steal can split them.
ONE_WORKER_MODULES = ("test_serve.py",)


def pytest_collection_modifyitems(config, items) -> None:
    items.sort(key=lambda item: item.path.name not in ONE_WORKER_MODULES)  # stable: the order within is kept


@pytest.fixture(scope="session", autouse=True)
def meshlm_cache(tmp_path_factory) -> Path:
    """MESHLM_CACHE for the whole session (also inherited by CLI subprocesses), one folder for all pytest-xdist
    workers: what meshlm caches there (the prepared embedded corpus, the synthetic JSONL sets) is written
    atomically, so the workers share one copy instead of preparing one each."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: the session's folder
    cache = Path(os.environ.get("MESHLM_TEST_CACHE") or shared / "meshlm-cache")
    cache.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("MESHLM_CACHE")
    os.environ["MESHLM_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("MESHLM_CACHE", None)
    else:
        os.environ["MESHLM_CACHE"] = old


@pytest.fixture(scope="session")
def debug_dataset(meshlm_cache) -> Path:
    """The embedded corpus prepared at the `debug` flavour's vocabulary (once per session: a second xdist worker
    waits for the first's instead of preparing its own)."""
    from filelock import FileLock  # a dependency of torch

    from meshlm.data import ensure_embedded_dataset
    from meshlm.models import flavor_config

    with FileLock(str(meshlm_cache / "debug-dataset.lock")):
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

    def train(folder: Path) -> dict:
        run = folder / "run"
        init_run_dir(run, config_to_toml(cfg), resume=False)
        Trainer(cfg, run).train()
        return {"run": str(run)}

    return Path(once_per_session(tmp_path_factory, "tiny-run", train)["run"])  # one for both xdist workers


@pytest.fixture(scope="session")
def posttrain_base_run(tmp_path_factory) -> Path:
    """`meshlm train` of the debug flavour for 4 steps on the embedded corpus (seq 64, batch 8): the
    checkpoint.init_from base of the post-training and LoRA tests, one per session. Read it, never write it."""
    from helpers import meshlm

    def train(folder: Path) -> dict:
        run = folder / "run"
        overrides = ["model.flavor=debug", "data.seq_len=64", "training.batch_size=8", "schedule.warmup_steps=2",
                     "metrics.progress=plain", "metrics.tensorboard=false", "metrics.comm_sample_interval=0",
                     "training.eval_interval=0", "training.steps=4", "metrics.interval=4"]
        meshlm("train", *[a for o in overrides for a in ("--set", o)], "--run-dir", str(run))
        return {"run": str(run)}

    return Path(once_per_session(tmp_path_factory, "posttrain-base-run", train)["run"])
