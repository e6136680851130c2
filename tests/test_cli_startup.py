"""The CLI parses and validates before it imports torch: ``meshlm --help``, ``config keys|show`` and argument errors
never load it (a property; scripts/bench_generate.py --startup times it).

Each case runs in a fresh interpreter, since ``sys.modules`` keeps whatever an earlier import loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT

PROBE = """
import json, sys
from meshlm.cli.main import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules}), file=sys.stderr)
"""


def _run(argv: list[str]) -> tuple[int, bool, str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    lines = proc.stderr.strip().splitlines()
    result = json.loads(lines[-1])
    return result["code"], result["torch"], "\n".join(lines[:-1])


def test_build_parser_does_not_import_torch():
    code = "import sys; from meshlm.cli.main import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("argv, exit_code", [
    (["--help"], 0),
    (["config", "keys", "--json"], 0),
    (["config", "show", "--json", "--set", "training.steps=3"], 0),
    (["train", "--no-such-flag"], 2),  # argparse's own error
    (["config", "show", "--set", "training.stepz=3"], 2),  # a config error (did you mean ...)
    (["bench", "generate", "--checkpoint", "nowhere", "--batch", "0"], 2),  # a value checked in run()
    (["bench", "train", "--lora-rank", "4", "--lora-targets", "q,wq"], 2),
])
def test_cli_answers_without_torch(argv, exit_code):
    code, torch_loaded, stderr = _run(argv)
    assert code == exit_code, stderr
    assert not torch_loaded, f"meshlm {' '.join(argv)} imported torch"
    if exit_code == 2:
        assert "Traceback" not in stderr and stderr.strip(), stderr
