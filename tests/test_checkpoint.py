"""Checkpoint manager: atomic layout, manifest verification, fallback, pruning, exact restore."""

import json

import pytest
import torch
from torch import nn

from meshlm.checkpoint.manager import CheckpointManager, find_latest_valid, list_checkpoints, verify_checkpoint
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
