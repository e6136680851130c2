"""The run directory: one run per folder; a second run refuses to overwrite the first."""

from __future__ import annotations

import tomllib
from pathlib import Path

from meshlm.fileio import atomic_write_text
from meshlm.errors import CheckpointError

RESOLVED = "config.resolved.toml"


def check_run_dir(run_dir: Path, config_toml: str, resume: bool) -> None:
    """Refuse a folder that holds another run (unless resuming it) or unrelated files. Writes nothing."""
    run_dir = Path(run_dir)
    existing = run_dir / RESOLVED
    if existing.is_file():
        if not resume:
            raise CheckpointError(f"run directory '{run_dir}' already holds a run; pass --resume auto to continue "
                                  "it, or choose another --run-dir")
        _check_same_model(existing, config_toml)
    elif run_dir.is_dir() and any(run_dir.iterdir()):
        raise CheckpointError(f"run directory '{run_dir}' is not empty and is not a meshlm run; choose another "
                              "--run-dir")


def write_run_dir(run_dir: Path, config_toml: str) -> None:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / RESOLVED, config_toml)


def init_run_dir(run_dir: Path, config_toml: str, resume: bool) -> None:
    """Check, then create ``run_dir`` and write the resolved config atomically (single process)."""
    check_run_dir(run_dir, config_toml, resume)
    write_run_dir(run_dir, config_toml)


def _check_same_model(existing: Path, config_toml: str) -> None:
    old = tomllib.loads(existing.read_text()).get("model", {})
    new = tomllib.loads(config_toml).get("model", {})
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if changed:
        raise CheckpointError(f"--resume: the model differs from the run in {existing.parent} "
                              f"(model.{', model.'.join(changed)}); resume with the same [model] or use a new "
                              "--run-dir")
