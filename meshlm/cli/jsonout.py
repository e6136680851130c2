"""``--json``: the JSON document alone on stdout, every log line on stderr.

While a command runs with ``--json``, file descriptor 1 points at stderr, so whatever prints — our own
progress lines, a library's, a rank process the command launches (children inherit the descriptor) — lands on
stderr. The document itself goes to the saved stdout through :func:`emit`. Commands that report one result
emit one document; ``generate --json`` emits one JSON object per line (one per sample).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, Iterator

_stdout_fd: int | None = None  # the real stdout while a --json command runs


@contextlib.contextmanager
def json_stdout(enabled: bool) -> Iterator[None]:
    """Route descriptor 1 to stderr for the duration (when ``enabled``); :func:`emit` still reaches stdout."""
    global _stdout_fd
    if not enabled or _stdout_fd is not None:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    _stdout_fd = saved
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        _stdout_fd = None


def emit(document: Any, indent: int | None = None) -> None:
    """Write one JSON document (and a newline) to stdout, the real one under :func:`json_stdout`."""
    data = (json.dumps(document, indent=indent) + "\n").encode()
    sys.stdout.flush()
    if _stdout_fd is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    while data:
        data = data[os.write(_stdout_fd, data):]
