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
