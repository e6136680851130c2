"""Running the CLI the way users do: ``python -m meshlm ...`` in a subprocess, from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def meshlm(*args: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "meshlm", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if check and proc.returncode != 0:
        fatal = proc.stderr.find("Fatal Python error")  # a native abort: show where it happened
        detail = proc.stderr[fatal:fatal + 6000] if fatal >= 0 else proc.stderr[-3000:]
        raise AssertionError(f"meshlm {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{detail}")
    return proc


def once_per_session(tmp_path_factory, name: str, produce) -> dict:
    """``produce(folder) -> JSON-able dict``, computed once per test session however many pytest-xdist workers
    ask: the first to ask computes it in a folder all workers share while the others wait on a lock, then read
    the result. For expensive module fixtures whose tests xdist may spread over both workers (a module-scoped
    fixture alone would then run once per worker)."""
    import json

    from filelock import FileLock  # a dependency of torch

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: the session's folder
    result = shared / f"shared-{name}.json"
    with FileLock(str(shared / f"shared-{name}.lock")):
        if not result.exists():  # (a worker whose produce() raised left none: the next one tries afresh)
            folder = shared / f"shared-{name}" / os.environ.get("PYTEST_XDIST_WORKER", "main")
            folder.mkdir(parents=True)
            result.write_text(json.dumps(produce(folder)))
    return json.loads(result.read_text())


def meshlm_in_process(*args: str) -> subprocess.CompletedProcess:
    """``meshlm ARGS`` through the CLI's own ``main()`` in this process, without a new interpreter importing torch:
    for commands a test expects to refuse (a user error's one line on stderr and exit code 2). An unexpected
    exception propagates with its traceback, so the test fails as it would on a subprocess's traceback."""
    import contextlib
    import io

    from meshlm.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(["meshlm", *args], code, out.getvalue(), err.getvalue())
