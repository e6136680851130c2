"""Tied embeddings (model.tie_embeddings=true) under every kind of parallelism: the head stays the embedding.

Tensor parallelism keeps one vocab-sharded parameter for both uses; FSDP shards it once; pipeline parallelism
keeps a copy on each end stage and sums their gradients (meshlm/distributed/pipeline.py TiedEmbeddings).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from meshlm.checkpoint.load import model_from_checkpoint
from meshlm.models import build_model
from helpers import meshlm, once_per_session
from parity_batch import Case, run_cases

CFG = "configs/debug.toml"
TIED = ["--set", "model.tie_embeddings=true"]
QUIET = ["--set", "metrics.tensorboard=false", "--set", "metrics.progress=plain"]


def sets(**values) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k.replace('__', '.')}={v}")]


TIED_LAYOUTS = {
    "tp2-sp": (2, sets(parallel__tp=2, parallel__dp_shard=1)),
    "fsdp2": (2, sets(parallel__dp_shard=2)),
    "pp2-1f1b": (2, sets(parallel__pp=2, parallel__dp_shard=1, parallel__pp_schedule="1f1b")),
    "fsdp2xtp2": (4, sets(parallel__dp_shard=2, parallel__tp=2)),
    # both copies on one rank (V placement: stages 0 and 3 on pp rank 0): summed locally
    "pp2-zbv": (2, sets(parallel__pp=2, parallel__dp_shard=1, parallel__pp_schedule="zbv")),
    # a middle stage between the holders: the sum goes over a 2-rank group of pp ranks 0 and 3
    "pp4-1f1b": (4, sets(parallel__pp=4, parallel__dp_shard=1, parallel__pp_schedule="1f1b")),
}


@pytest.fixture(scope="module")
def tied_reports(debug_dataset, tmp_path_factory) -> dict[str, dict]:
    """`meshlm diagnose parity CFG --nproc N --steps 4 TIED ARGS --json` of every layout, one launch per world
    size (tests/parity_batch.py), once per session."""
    cases = {name: Case(nproc, [*TIED, *args][1::2], 4, CFG) for name, (nproc, args) in TIED_LAYOUTS.items()}
    return once_per_session(tmp_path_factory, "tied-layouts", lambda work: run_cases(cases, work))


@pytest.mark.parametrize("name", list(TIED_LAYOUTS))
def test_tied_layout_matches_single_device(name, tied_reports):
    """Per-step loss and grad norm of a tied model vs the tied single device (fp32, parity tolerances). An untied
    head (two matrices) or a tied gradient counted once per stage would drift from the reference from step 2 on,
    and a norm counting the pipelined copy twice would differ at step 1."""
    report = tied_reports[name]
    assert report["ok"], report
    assert [r["step"] for r in report["steps"]] == [1, 2, 3, 4]
    assert report["max_loss_rel_diff"] < 1e-5


def _stored_model(checkpoint, tmp_path) -> dict[str, torch.Tensor]:
    dcp_to_torch_save(checkpoint / "dcp", tmp_path / "whole.pt")
    return torch.load(tmp_path / "whole.pt", weights_only=True)["model"]


def test_tp_tied_checkpoint_reloads_tied_with_the_trained_head(debug_dataset, tmp_path):
    """Train tied under TP 2 (+SP, loss parallel), then reload on one device: the tied matrix is stored once (as
    the embedding), the reloaded model is tied, and its logits are those of an untied model given the stored
    embedding as its head explicitly."""
    run = tmp_path / "run"
    meshlm("train", CFG, "--nproc", "2", *TIED, *sets(parallel__tp=2, parallel__dp_shard=1, training__steps=3,
           training__eval_interval=0, data__seq_len=32), *QUIET, "--run-dir", str(run))
    model, job, state, ckpt = model_from_checkpoint(run)
    stored = _stored_model(ckpt, tmp_path)
    assert "output.weight" not in stored  # one copy on disk
    stored["output.weight"] = stored["tok_embeddings.weight"]
    initial = build_model(job.model, "cpu", seed=job.training.seed)
    assert not torch.equal(stored["tok_embeddings.weight"], initial.tok_embeddings.weight)  # it did train
    assert model.output.weight is model.tok_embeddings.weight
    assert torch.equal(model.tok_embeddings.weight, stored["tok_embeddings.weight"])
    untied = build_model(dataclasses.replace(job.model, tie_embeddings=False), "cpu", seed=0).eval()
    untied.load_state_dict(stored)
    tokens = torch.randint(0, job.model.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(tokens), untied(tokens))


def test_pp_tied_copies_stay_bitwise_equal(debug_dataset, tmp_path):
    """Pipelined tied run: the first stage's embedding and the last stage's head are separate copies whose
    gradients are summed every step; after training both stored copies (and their Adam moments) are identical."""
    run = tmp_path / "run"
    meshlm("train", CFG, "--nproc", "2", *TIED, *sets(parallel__pp=2, parallel__dp_shard=1, training__steps=3,
           training__eval_interval=0, data__seq_len=32), *QUIET, "--run-dir", str(run))
    _, _, _, ckpt = model_from_checkpoint(run)
    dcp_to_torch_save(ckpt / "dcp", tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    model, optim = whole["model"], whole["optimizer"]
    assert torch.equal(model["output.weight"], model["tok_embeddings.weight"])
    for moment in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(optim[f"state.output.weight.{moment}"], optim[f"state.tok_embeddings.weight.{moment}"])
        assert optim[f"state.output.weight.{moment}"].abs().sum() > 0
