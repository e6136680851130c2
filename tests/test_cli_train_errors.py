"""``meshlm train`` answers a config it cannot read before it imports torch (a structural check, not a timed one:
``python -X importtime`` lists every module the process imported, and torch must not be among them)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT


def _train_importtime(config: str) -> tuple[int, str, set[str]]:
    """(exit code, stderr without the import-time lines, the top-level names of the modules imported)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "meshlm", "train", config],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    imported, rest = set(), []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:"):
            imported.add(line.rsplit("|", 1)[-1].strip().split(".")[0])
        else:
            rest.append(line)
    return proc.returncode, "\n".join(rest), imported


@pytest.mark.parametrize("kind", ["missing", "folder", "not-toml"])
def test_train_refuses_an_unreadable_config_before_importing_torch(tmp_path, kind):
    config = tmp_path / "job.toml"
    if kind == "folder":
        config.mkdir()
    elif kind == "not-toml":
        config.write_text("[training\nsteps = 3\n")
    code, stderr, imported = _train_importtime(str(config))
    assert code == 2, stderr
    assert "Traceback" not in stderr and str(config) in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "meshlm" in imported  # the probe saw the imports at all
    assert "torch" not in imported, f"meshlm train {kind} config imported torch before answering"
