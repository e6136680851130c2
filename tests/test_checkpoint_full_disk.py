"""A checkpoint save the file system refuses: one line naming the checkpoint and the cause, exit 2, the previous
checkpoint intact and verifiable, no ``.tmp`` left behind; and ``--resume auto`` after an unfinished save's leftover
``.tmp`` on a full disk removes it and resumes.

The full disk is real where the tests may mount a small tmpfs (root, as on the development machines): the write
fails inside DCP's ``torch.save`` exactly as it does for users. Where mounting is not allowed those tests skip, and
``test_refused_write_is_one_line_simulated`` still runs: it raises ``OSError(ENOSPC / EACCES)`` from a patched
``torch.save`` (the function DCP writes each shard with), so only the error's origin is simulated.
"""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import meshlm
from torch import nn

from meshlm.checkpoint.manager import CheckpointManager, list_checkpoints, verify_checkpoint
from meshlm.errors import CheckpointError
from meshlm.train.run_dir import write_run_dir


@pytest.fixture
def small_disk(tmp_path):
    """``mount(size) -> folder``: a tmpfs of ``size`` (e.g. "1500k") at a fresh folder; unmounted afterwards."""
    mounted = []

    def mount(size: str) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}); the simulated "
                        "test covers the error path")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _toy(width: int = 256) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(width, width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    return model, opt


def _fill(folder: Path, leave_bytes: int = 0) -> Path:
    """Fill the file system of ``folder`` up to ``leave_bytes`` free with one file; the file."""
    stat = os.statvfs(folder)
    free = stat.f_bavail * stat.f_frsize
    filler = folder / "filler"
    with open(filler, "wb") as f:
        try:
            f.write(b"\0" * max(free - leave_bytes, 0))
        except OSError:  # a tmpfs may count its own pages: full is full enough
            pass
    return filler


def _assert_refused(exc: CheckpointError, root: Path, step: int, cause: str, previous: int) -> None:
    message = str(exc)
    assert "\n" not in message
    assert str(root / f"step-{step:08d}") in message and cause in message, message
    assert f"step-{previous:08d} is untouched" in message and "--resume auto" in message, message
    assert [s for s, _ in list_checkpoints(root)] == [previous]
    assert verify_checkpoint(root / f"step-{previous:08d}") is None
    assert not list(root.glob("*.tmp")), "the failed save left its .tmp folder"


def test_full_disk_save_is_one_line_and_keeps_the_previous_checkpoint(small_disk):
    disk = small_disk("4m")
    model, opt = _toy()
    mgr = CheckpointManager(disk / "run", keep_last=3)
    first = mgr.save(1, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    _fill(disk, leave_bytes=(sum(f.stat().st_size for f in first.rglob("*") if f.is_file())) // 2)
    with pytest.raises(CheckpointError) as info:
        mgr.save(2, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    _assert_refused(info.value, mgr.root, 2, "no space left on device", previous=1)


@pytest.mark.parametrize("code, cause", [(errno.ENOSPC, "no space left on device"),
                                         (errno.EACCES, "permission denied")])
def test_refused_write_is_one_line_simulated(tmp_path, monkeypatch, code, cause):
    """Simulated: ``torch.save`` raises the OSError when DCP writes a shard into its file (RNG states, saved into
    memory, still go through the real function)."""
    model, opt = _toy(8)
    mgr = CheckpointManager(tmp_path / "run", keep_last=3)
    mgr.save(1, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    real_save = torch.save

    def refusing_save(obj, f, *args, **kwargs):
        if isinstance(f, io.BytesIO):
            return real_save(obj, f, *args, **kwargs)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(torch, "save", refusing_save)
    with pytest.raises(CheckpointError) as info:
        mgr.save(2, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    _assert_refused(info.value, mgr.root, 2, cause, previous=1)


def test_start_removes_an_unfinished_save(tmp_path):
    run = tmp_path / "run"
    leftover = run / "checkpoints" / "step-00000004.tmp"
    (leftover / "dcp").mkdir(parents=True)
    (leftover / "dcp" / "__0_0.distcp").write_bytes(b"partial")
    write_run_dir(run, "[model]\n")
    assert not leftover.exists() and (run / "config.resolved.toml").read_text() == "[model]\n"


def test_cli_full_disk_then_resume_after_a_leftover_tmp(small_disk):
    """On a real full disk: the save of step 4 fails with exit 2 and one line; step 2 stays valid. Then, with the
    filler gone but a crashed save's ``step-00000004.tmp`` filling the disk, ``--resume auto`` removes it and
    finishes."""
    disk = small_disk("48m")
    run = disk / "run"
    args = ["train", "--run-dir", str(run), "--set", "training.steps=4", "--set", "checkpoint.interval=2",
            "--set", "training.eval_interval=0", "--set", "metrics.interval=2", "--set", "metrics.tensorboard=false",
            "--set", "metrics.progress=plain"]
    meshlm(*args, "--stop-at", "2")
    step2 = run / "checkpoints" / "step-00000002"
    size = sum(f.stat().st_size for f in step2.rglob("*") if f.is_file())
    filler = _fill(disk, leave_bytes=size // 2)
    proc = meshlm(*args, "--resume", "auto", check=False)
    error = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and len(error) == 1, proc.stderr[-3000:]
    assert "step-00000004: no space left on device" in error[0], error[0]
    assert [s for s, _ in list_checkpoints(run / "checkpoints")] == [2] and verify_checkpoint(step2) is None
    filler.unlink()  # the user frees space; an unfinished save (a crash) fills it again
    leftover = run / "checkpoints" / "step-00000004.tmp"
    leftover.mkdir()
    _fill(leftover)
    proc = meshlm(*args, "--resume", "auto")
    assert "removed " + str(leftover) in proc.stdout and "resumed from " + str(step2) in proc.stdout
    assert [s for s, _ in list_checkpoints(run / "checkpoints")] == [2, 4] and not leftover.exists()
    assert verify_checkpoint(run / "checkpoints" / "step-00000004") is None
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4]


def test_an_unexplained_write_failure_reaches_the_collective_before_it_is_raised(tmp_path, monkeypatch):
    """A bug while writing (no file-system cause) is sent through the same collective as a cause, then raised:
    raised at once on one rank, it left the other ranks waiting in the gather/broadcast. Another rank raises a
    RuntimeError naming it."""
    import meshlm.checkpoint.manager as manager

    model, opt = _toy(8)
    mgr = CheckpointManager(tmp_path / "run", keep_last=3)
    mgr.save(1, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    sent = []
    real_gather = manager._gather_to_rank0
    monkeypatch.setattr(manager, "_gather_to_rank0", lambda obj: sent.append(obj[1]) or real_gather(obj))

    def buggy(*args, **kwargs):
        raise TypeError("a bug")

    monkeypatch.setattr(mgr, "_write_rank_files", buggy)
    with pytest.raises(TypeError, match="a bug"):
        mgr.save(2, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    assert sent == ["internal error: TypeError"]
    assert [s for s, _ in list_checkpoints(mgr.root)] == [1] and not list(mgr.root.glob("*.tmp"))
    with pytest.raises(RuntimeError, match="internal error: TypeError on another rank"):
        mgr._raise_if("internal error: TypeError", mgr.root / "step-00000002")
