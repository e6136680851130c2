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
