"""Ending a rank's process once its work is written: ``os._exit``, not an interpreter shutdown.

Why. gloo runs each process group's collectives on native threads (``pt_gloo_runloop``, two per group, and one
``gloo_tcp_loop``), and with torch 2.13 they outlive ``destroy_process_group()``: the groups stay referenced
(every ``DeviceMesh`` keeps its groups in ``_pg_registry``; ``torch.distributed.nn.functional`` binds the world
group into its functions' default arguments when it is imported; with both dropped, two of the five groups of a
2-rank TP process still kept their threads, held from outside Python), so such a process still has 15 of these
threads after destroying its groups. When one of them touches Python while the
interpreter finalizes — it drops the last reference to a tensor that has a Python object, or runs a future's
Python callback — CPython ends that thread with ``pthread_exit``, whose forced unwinding through a ``noexcept``
C++ frame calls ``std::terminate``: "terminate called without an active exception", SIGABRT, after a rank that
finished its work. The window is a thread's last microseconds of cleanup after the final collective, so it shows
rarely, and more often on a loaded machine (tests/test_teardown.py makes it certain: a future's callback that a
gloo thread starts from an atexit handler's collective).

Leaving with ``os._exit`` after flushing runs no finalization and no C++ static destructors, so no thread can meet
a dying interpreter. Everything a rank must leave behind is written and closed before (files are written
atomically; the process group is destroyed first).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def end_rank(code: int = 0) -> NoReturn:
    """Flush stdout/stderr and end this process with ``code``, skipping interpreter finalization."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can reach it anyway
            pass
    os._exit(code)
