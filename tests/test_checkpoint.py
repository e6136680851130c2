"""Checkpoint manager: atomic layout, manifest verification, fallback, pruning, safe replacement, exact restore,
hashing once while writing, and the resume decision made by rank 0 for every rank."""

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import meshlm
from torch import nn

from meshlm.checkpoint import manager as manager_module
from meshlm.checkpoint.manager import (
    CheckpointManager,
    choose_resume_checkpoint,
    find_latest_valid,
    list_checkpoints,
    verify_checkpoint,
)
from meshlm.distributed.teardown import end_rank
from meshlm.errors import CheckpointError


def _toy(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def test_save_load_roundtrip_is_exact(tmp_path):
    model, opt = _toy(0)
    mgr = CheckpointManager(tmp_path, keep_last=2)
    path = mgr.save(5, [model], [opt], {"tokens_seen": 10, "loader": {"x": 1}}, "[model]\n")
    assert path.name == "step-00000005" and verify_checkpoint(path) is None
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["files"]) >= {"train_state.json", "config.toml", "rng/rank-00000.pt"}
    other, other_opt = _toy(1)
    state = mgr.load(path, [other], [other_opt])
    assert state["step"] == 5 and state["loader"] == {"x": 1}
    for a, b in zip(model.parameters(), other.parameters()):
        assert torch.equal(a, b)
    sa, sb = opt.state_dict()["state"], other_opt.state_dict()["state"]
    assert all(torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) for k in sa)


def test_corruption_detected_and_skipped(tmp_path):
    model, opt = _toy(0)
    mgr = CheckpointManager(tmp_path, keep_last=3)
    first = mgr.save(1, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    second = mgr.save(2, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    shard = next((second / "dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert "sha256" in verify_checkpoint(second)
    warnings = []
    assert find_latest_valid(mgr.root, warn=warnings.append) == first
    assert "step-00000002" in warnings[0] and "falling back" in warnings[0]
    (first / "train_state.json").write_text("{}")  # size changes: reported as truncated
    assert "manifest says" in verify_checkpoint(first)


def test_incomplete_save_is_ignored_and_pruning_keeps_last(tmp_path):
    model, opt = _toy(0)
    mgr = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        mgr.save(step, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    assert [s for s, _ in list_checkpoints(mgr.root)] == [2, 3]
    crashed = mgr.root / "step-00000004.tmp"
    crashed.mkdir()
    (crashed / "train_state.json").write_text("{}")
    assert find_latest_valid(mgr.root).name == "step-00000003"
    no_manifest = mgr.root / "step-00000005"
    no_manifest.mkdir()
    assert "manifest.json is missing" in verify_checkpoint(no_manifest)


def test_incompatible_model_is_a_clear_error(tmp_path):
    model, opt = _toy(0)
    mgr = CheckpointManager(tmp_path, keep_last=1)
    path = mgr.save(1, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    wrong = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    with pytest.raises(CheckpointError, match="does not fit this model"):
        mgr.load(path, [wrong], [torch.optim.AdamW(wrong.parameters())])


def _crash_when_moving_in(monkeypatch) -> None:
    """Make the rename of a finished ``step-X.tmp`` folder into place fail, as a crash at that moment would."""
    real = os.replace

    def replace(src, dst):
        if Path(src).name.endswith(".tmp") and Path(dst).name.startswith("step-"):
            raise OSError("simulated crash before the new checkpoint moved in")
        return real(src, dst)

    monkeypatch.setattr(manager_module.os, "replace", replace)


def test_replacing_a_step_keeps_a_complete_copy_at_every_moment(tmp_path, monkeypatch):
    """A re-save of an existing step renames the old folder aside before the new one moves in: a crash in
    between leaves the old copy (``step-X.old``), which still counts as step X; the next save cleans up."""
    model, opt = _toy(0)
    mgr = CheckpointManager(tmp_path, keep_last=2)
    old = mgr.save(1, [model], [opt], {"tokens_seen": 1, "loader": {}}, "")
    old_manifest = (old / "manifest.json").read_text()
    with monkeypatch.context() as m:
        _crash_when_moving_in(m)
        with pytest.raises(OSError, match="simulated crash"):
            mgr.save(1, [model], [opt], {"tokens_seen": 2, "loader": {}}, "")
    found = find_latest_valid(mgr.root)
    assert found is not None and found.name == "step-00000001.old"
    assert (found / "manifest.json").read_text() == old_manifest and verify_checkpoint(found) is None
    assert [s for s, _ in list_checkpoints(mgr.root)] == [1]
    again = mgr.save(1, [model], [opt], {"tokens_seen": 3, "loader": {}}, "")
    assert json.loads((again / "train_state.json").read_text())["tokens_seen"] == 3
    assert sorted(p.name for p in mgr.root.iterdir()) == ["step-00000001"]  # no aside, no .tmp left


def test_pruning_waits_for_the_new_checkpoint(tmp_path, monkeypatch):
    """keep_last=1: a save that fails before its checkpoint is in place deletes nothing."""
    model, opt = _toy(0)
    mgr = CheckpointManager(tmp_path, keep_last=1)
    first = mgr.save(1, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    _crash_when_moving_in(monkeypatch)
    with pytest.raises(OSError, match="simulated crash"):
        mgr.save(2, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    assert find_latest_valid(mgr.root) == first


def test_save_after_falling_back_past_a_corrupted_step_keeps_itself(tmp_path):
    """keep_last=1, step 200 corrupted, resume fell back to 100 and now saves 150: 150 is kept (not pruned in
    favour of the newer-numbered corrupted 200), and the corrupted 200 is removed so the next resume finds 150."""
    model, opt = _toy(0)
    mgr = CheckpointManager(tmp_path, keep_last=1)
    mgr.save(100, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    bad = CheckpointManager(tmp_path, keep_last=2).save(200, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    (bad / "train_state.json").write_text("{}")  # corrupted: fails its checksum
    saved = mgr.save(150, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    assert saved.is_dir() and verify_checkpoint(saved) is None
    assert find_latest_valid(mgr.root) == saved
    assert sorted(p.name for p in mgr.root.iterdir()) == ["step-00000150"]


def test_save_reads_back_only_the_tensor_files(tmp_path, monkeypatch):
    """The manifest's checksums come from the bytes as they are written (RNG state, train state, config,
    copied files); only DCP's own files are read back once, by the rank that wrote them."""
    model, opt = _toy(0)
    hashed = []
    real = manager_module.sha256_file
    monkeypatch.setattr(manager_module, "sha256_file", lambda path: hashed.append(Path(path).name) or real(path))
    extra = tmp_path / "tok.json"
    extra.write_text("{}")
    path = CheckpointManager(tmp_path / "run", keep_last=1).save(
        1, [model], [opt], {"loader": {}}, "[model]\n", extra_files={"tokenizer.json": extra})
    assert sorted(hashed) == sorted(p.name for p in (path / "dcp").iterdir())
    assert verify_checkpoint(path) is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _decide_worker(rank: int, world: int, port: int, root: str, result: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        calls = []
        if rank == 1:  # this rank's reads would fail (say, a flaky mount): it must not get to decide
            manager_module.verify_checkpoint = lambda path: calls.append(path) or "simulated read error"
        said = []
        chosen = choose_resume_checkpoint(Path(root), say=said.append)
        result[rank] = {"chosen": str(chosen), "verify_calls": len(calls), "said": said}
    finally:
        dist.destroy_process_group()
    end_rank(0)  # gloo's threads can abort an interpreter exit (meshlm/distributed/teardown.py)


def test_rank0_decides_the_resume_checkpoint_for_every_rank(tmp_path):
    model, opt = _toy(0)
    mgr = CheckpointManager(tmp_path, keep_last=3)
    for step in (1, 2):
        newest = mgr.save(step, [model], [opt], {"tokens_seen": 0, "loader": {}}, "")
    with mp.Manager() as manager:
        result = manager.dict()
        mp.spawn(_decide_worker, args=(2, _free_port(), str(mgr.root), result), nprocs=2, join=True)
        result = {k: dict(v) for k, v in result.items()}
    assert result[0]["chosen"] == result[1]["chosen"] == str(newest)
    assert result[1]["verify_calls"] == 0 and result[1]["said"] == []
    assert any("verified by rank 0" in line for line in result[0]["said"])


def test_two_rank_resume_past_a_corrupted_checkpoint(debug_dataset, tmp_path):
    """2 ranks, the newest checkpoint corrupted: rank 0 reports it once, verifies the previous one once, and
    both ranks resume from it (the run then trains on to the end and saves a valid newest step again)."""
    run = tmp_path / "run"
    cfg = ["configs/debug.toml", "--nproc", "2", "--run-dir", str(run), "--set", "training.steps=4",
           "--set", "checkpoint.interval=2", "--set", "training.eval_interval=0", "--set", "metrics.interval=1",
           "--set", "metrics.tensorboard=false", "--set", "data.seq_len=32"]
    meshlm("train", *cfg)
    shard = next((run / "checkpoints" / "step-00000004" / "dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    out = meshlm("train", *cfg, "--resume", "auto").stdout
    assert out.count("step-00000004 is not usable") == 1
    assert out.count("verified by rank 0") == 1 and "step-00000002 verified by rank 0" in out
    assert "resumed from" in out and "at step 2" in out
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert verify_checkpoint(run / "checkpoints" / "step-00000004") is None


def _dataset_worker(rank: int, world: int, port: int, data: str, result: dict) -> None:
    from meshlm.data import TokenDataset
    from meshlm.distributed.rank0 import checked_on_rank0
    from meshlm.errors import DataError

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        opened = []
        try:
            checked_on_rank0(lambda: opened.append("sha256") or TokenDataset(data),
                             lambda: opened.append("sizes") or TokenDataset(data, verify=False))
            result[rank] = {"opened": opened, "error": ""}
        except DataError as exc:
            result[rank] = {"opened": opened, "error": str(exc)}
    finally:
        dist.destroy_process_group()
    end_rank(0)  # gloo's threads can abort an interpreter exit (meshlm/distributed/teardown.py)


@pytest.mark.parametrize("corrupt", [False, True], ids=["intact", "corrupted"])
def test_dataset_checksums_are_verified_on_rank0_only(corrupt, debug_dataset, tmp_path):
    """Rank 0 hashes the shards, the others check sizes only (after rank 0 is done); a corrupted shard (same
    size) stops every rank with rank 0's message."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(debug_dataset, data)
    if corrupt:
        shard = sorted(data.glob("train-*.bin"))[0]
        raw = bytearray(shard.read_bytes())
        raw[0] ^= 0xFF
        shard.write_bytes(bytes(raw))
    with mp.Manager() as manager:
        result = manager.dict()
        mp.spawn(_dataset_worker, args=(2, _free_port(), str(data), result), nprocs=2, join=True)
        result = {k: dict(v) for k, v in result.items()}
    assert result[0]["opened"] == ["sha256"]
    if corrupt:
        assert "corrupted (checksum mismatch)" in result[0]["error"] and result[1]["error"] == result[0]["error"]
        assert result[1]["opened"] == []  # rank 1 never opened it
    else:
        assert result[0]["error"] == result[1]["error"] == "" and result[1]["opened"] == ["sizes"]
