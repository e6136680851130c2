"""Why a checkpoint could not be written, in the file system's words ("no space left on device").

A full disk rarely surfaces as such: DCP writes each shard with ``torch.save`` into a Python file object, and when
that write fails torch's zip writer reports only "unexpected pos 704 vs 598" (torch 2.13), wrapped in a
``CheckpointException``. So the cause is looked for in two places: an ``OSError`` anywhere in the exception's
chain (or in DCP's per-rank failures), else a small probe write into the folder the save was writing, which
fails the same way while the disk is still full (the failed save's partial files still hold the space).
"""

from __future__ import annotations

import os
from pathlib import Path

from torch.distributed.checkpoint.api import CheckpointException

PROBE_BYTES = 1 << 20  # the probe must not fit where the failed shard did not; a full disk has ~0 bytes left


def _related(exc: BaseException) -> list[BaseException]:
    """``exc``, its causes and contexts, and the exceptions DCP gathered from each rank, depth first."""
    seen, order, todo = set(), [], [exc]
    while todo:
        item = todo.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        order.append(item)
        todo += [item.__context__, item.__cause__]
        if isinstance(item, CheckpointException):
            todo += [failure[0] for failure in item.failures.values()]
    return order


def _cause_of(exc: OSError, where: Path | str | None = None) -> str:
    reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
    reason = reason[:1].lower() + reason[1:]
    where = where or exc.filename
    return f"{reason} ({where})" if where else reason


def _probe(folder: Path) -> OSError | None:
    """Write and remove ``PROBE_BYTES`` in ``folder`` (or its nearest existing parent); the error, if any."""
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    probe = folder / ".meshlm-write-probe"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
    return None


def describe_write_failure(exc: BaseException, folder: Path) -> str | None:
    """The file-system cause of a failed write into ``folder`` ("no space left on device (PATH)", "permission
    denied (PATH)"), or None when the file system is not to blame (a bug: the caller re-raises)."""
    for item in _related(exc):
        if isinstance(item, OSError) and item.errno is not None:
            return _cause_of(item)
    probed = _probe(Path(folder))
    return None if probed is None else _cause_of(probed, where=folder)
