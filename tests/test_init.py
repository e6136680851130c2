"""Layout-independent initialisation (meshlm/models/init.py): every layout materialises exactly the values
the single-device model starts from, and a tied head stays one parameter under tensor parallelism."""

from __future__ import annotations

import dataclasses
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from meshlm.config.loader import load_config
from meshlm.distributed.pipeline import split_model
from meshlm.distributed.teardown import end_rank
from meshlm.models import build_model, flavor_config, meta_model
from meshlm.models.init import materialize


def test_init_depends_on_seed_and_name_only():
    cfg = flavor_config("debug")
    a, b, c = (build_model(cfg, "cpu", seed=s) for s in (0, 0, 1))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.layers["0"].attention.wq.weight, c.layers["0"].attention.wq.weight)
    # same shape and std, different names: different draws
    assert not torch.equal(a.layers["0"].attention.wq.weight, a.layers["1"].attention.wq.weight)


def test_pipeline_stages_materialise_the_single_device_values():
    """Each stage of a split meta model, materialised alone, holds exactly the full model's values for its names;
    a tied head on the last stage starts equal to the embedding on the first."""
    cfg = dataclasses.replace(flavor_config("debug"), tie_embeddings=True)
    full = build_model(cfg, "cpu", seed=3)
    reference = full.state_dict()
    stages = split_model(meta_model(cfg), [0, 1], 2)
    for stage in stages:
        materialize(stage, "cpu", seed=3)
        for name, tensor in stage.state_dict().items():
            assert torch.equal(tensor, reference[name]), name
        torch.testing.assert_close(stage.rope_cos, full.rope_cos, rtol=0, atol=0)
    assert stages[0].output is None and stages[1].tok_embeddings is None
    assert torch.equal(stages[1].output.weight, stages[0].tok_embeddings.weight)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sharded_worker(rank: int, world: int, port: int, overrides: list[str], result: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from meshlm.distributed.engine import Engine

        cfg = load_config(None, overrides)
        engine = Engine(cfg.parallel, torch.device("cpu"))
        (part,) = engine.parallelize(meta_model(cfg.model), cfg.training, None, 1)
        reference = build_model(cfg.model, "cpu", seed=cfg.training.seed).state_dict()
        mismatched = [name for name, p in part.state_dict().items()
                      if not torch.equal(p.full_tensor() if hasattr(p, "full_tensor") else p, reference[name])]
        tied = part.output.weight is part.tok_embeddings.weight
        if rank == 0:
            result.update(mismatched=mismatched, tied=tied, sharded=type(part.output.weight).__name__,
                          local_rows=part.output.weight.to_local().shape[0])
    finally:
        dist.destroy_process_group()
    # gloo's threads outlive the destroyed groups; an interpreter exit can abort the rank (SIGABRT) when one
    # touches Python during finalization (meshlm/distributed/teardown.py, tests/test_teardown.py)
    end_rank(0)


@pytest.mark.parametrize("world, layout", [
    (4, ["parallel.dp_shard=2", "parallel.tp=2"]),
    (2, ["parallel.tp=2", "parallel.dp_shard=1"]),
], ids=["fsdp2xtp2", "tp2"])
def test_sharded_init_equals_single_device(world, layout):
    """Materialise a TP/FSDP-sharded meta model on gloo ranks: full_tensor() of every parameter equals the
    single-device model bitwise, and the tied head is the embedding's parameter (one DTensor, vocab-sharded)."""
    overrides = ["model.tie_embeddings=true", "training.seed=7", *layout]
    with mp.Manager() as manager:
        result = manager.dict()
        mp.spawn(_sharded_worker, args=(world, _free_port(), overrides, result), nprocs=world, join=True)
        result = dict(result)
    assert result["mismatched"] == []
    assert result["tied"] and result["sharded"] == "DTensor"
    vocab = flavor_config("debug").vocab_size
    assert result["local_rows"] == vocab // world  # every rank holds only its rows of the embedding
