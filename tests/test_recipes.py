"""The launch recipes in examples/ are valid: shell syntax, and a Kubeflow PyTorchJob that runs `meshlm train`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.sh")) + [EXAMPLES / "slurm.sbatch"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shell_recipes_parse(script):
    assert script.is_file()
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "meshlm train" in script.read_text()


def test_pytorchjob_runs_meshlm_train():
    yaml = pytest.importorskip("yaml")
    job = yaml.safe_load((EXAMPLES / "pytorchjob.yaml").read_text())
    assert job["apiVersion"].startswith("kubeflow.org/") and job["kind"] == "PyTorchJob"
    workers = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    container = workers["template"]["spec"]["containers"][0]
    command = [str(part) for part in container["command"] + container.get("args", [])]
    assert command[0] == "torchrun"
    i = command.index("-m")
    assert command[i + 1:i + 3] == ["meshlm", "train"]
    assert any(part.startswith("--run-dir") for part in command)
