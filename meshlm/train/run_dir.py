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
    """Create ``run_dir`` and write the resolved config (one process: rank 0 or the launcher). An unfinished
    checkpoint folder of an earlier run (``checkpoints/step-*.tmp``, left by a crash or a full disk) is removed
    first: nothing writes it any more, and on a full disk it holds the space this start needs."""
    from meshlm.checkpoint.manager import remove_unfinished

    run_dir = Path(run_dir)
    for stale in remove_unfinished(run_dir / "checkpoints"):
        print(f"removed {stale}: an unfinished checkpoint save of an earlier run", flush=True)
    resolved = run_dir / RESOLVED
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not resolved.is_file() or resolved.read_text() != config_toml:  # a resume rewrites nothing unchanged
            atomic_write_text(resolved, config_toml)
    except OSError as exc:
        raise CheckpointError(f"cannot write {resolved}: {exc.strerror or exc}; free space (or fix the permissions) "
                              "of the run directory and start again") from None


def init_run_dir(run_dir: Path, config_toml: str, resume: bool) -> None:
    """Check, then create ``run_dir`` and write the resolved config atomically (single process)."""
    check_run_dir(run_dir, config_toml, resume)
    write_run_dir(run_dir, config_toml)


def _check_same_model(existing: Path, config_toml: str) -> None:
    old = tomllib.loads(existing.read_text()).get("model", {})
    new = tomllib.loads(config_toml).get("model", {})
    # model.head is what the build made of the head (models/build.py), written once the model is built: not an input
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k != "head")
    if changed:
        raise CheckpointError(f"--resume: the model differs from the run in {existing.parent} "
                              f"(model.{', model.'.join(changed)}); resume with the same [model] or use a new "
                              "--run-dir")
