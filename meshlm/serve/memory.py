"""Handing freed memory back to the operating system after large requests.

glibc keeps what ``free`` returns: after a large block is freed it raises its mmap threshold, so the next large
buffers (a batch's KV cache, a request body of megabytes) come from the heap, and a heap shrinks only from its
top. ``malloc_trim(0)`` returns every free page of every arena. The engine calls it when its batch empties, the
server after refusing a large request; scripts/probe_serve_memory.py measures the difference
(``MESHLM_MALLOC_TRIM=0`` turns it off for that comparison).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_ENABLED = os.environ.get("MESHLM_MALLOC_TRIM", "1") != "0"
_LIBC: list = []  # the C library, looked up on first use (None where it has no malloc_trim)


def trim_heap() -> None:
    """``malloc_trim(0)`` where the C library has it (glibc); otherwise nothing."""
    if not _ENABLED:
        return
    if not _LIBC:
        name = ctypes.util.find_library("c")
        lib = ctypes.CDLL(name) if name else None
        _LIBC.append(lib if lib is not None and hasattr(lib, "malloc_trim") else None)
    if _LIBC[0] is not None:
        _LIBC[0].malloc_trim(0)
