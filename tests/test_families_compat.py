"""Checkpoints written before model families (tests/data/ckpt-before-families: a language model and a reward
model, tiny, written by the code of commit fa7f236 with no model.family / model.head / layer kinds) still load,
and give the logits they gave then."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from meshlm.checkpoint.load import model_from_checkpoint

DATA = Path(__file__).parent / "data" / "ckpt-before-families"


@pytest.mark.parametrize("name", ["lm", "reward"])
def test_old_checkpoint_loads_with_the_same_logits(name):
    expected = torch.load(DATA / "expected.pt", weights_only=True)
    model, cfg, _, _ = model_from_checkpoint(DATA / name)
    assert "family" not in (DATA / name / "checkpoints/step-00000001/config.toml").read_text()  # truly old
    with torch.no_grad():
        logits = model(expected["tokens"])
    assert torch.equal(logits, expected[name])
    assert logits.shape[-1] == (1 if name == "reward" else cfg.model.vocab_size)


def test_old_checkpoints_get_the_head_their_build_has():
    """Written before model.head: an lm and a reward checkpoint get 'lm' and 'score' (as before, from the build)."""
    assert model_from_checkpoint(DATA / "lm")[0].cfg.head == "lm"
    assert model_from_checkpoint(DATA / "reward")[0].cfg.head == "score"
