"""Rank 0 decides, every rank follows: checks that read a whole dataset or checkpoint run once, on rank 0, and
their outcome (a value, or the user error they raised) reaches every rank through one broadcast."""

from __future__ import annotations

from typing import Callable, TypeVar

import torch.distributed as dist

from meshlm.errors import UserError

T = TypeVar("T")


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def checked_on_rank0(check: Callable[[], T], follow: Callable[[], T]) -> T:
    """Rank 0 runs ``check`` (e.g. opening a dataset with full checksums) while the others wait; then the others
    run ``follow`` (the cheap version: size checks only). A :class:`UserError` raised by ``check`` is raised
    on every rank with the same message, so all ranks exit 2 together instead of waiting on a missing peer.
    Collective when distributed."""
    if not _distributed():
        return check()
    result: T | None = None
    failure: UserError | None = None
    if dist.get_rank() == 0:
        try:
            result = check()
        except UserError as exc:
            failure = exc
    box = [None if failure is None else (type(failure), str(failure))]
    dist.broadcast_object_list(box, src=0)
    if failure is not None:
        raise failure
    if box[0] is not None:
        kind, message = box[0]
        raise kind(message)
    return result if dist.get_rank() == 0 else follow()  # type: ignore[return-value]
