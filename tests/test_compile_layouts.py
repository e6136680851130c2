"""training.compile under the layouts the other compile tests leave out: tensor parallelism with full and with
selective activation checkpointing, and pipeline parallelism (1F1B) — each against a single device.

Inductor's CPU compile dominates the cost, so the cases share one pair of gloo processes (one process group,
started once for the module) and run one after another in it, 2 steps each; dynamo's caches are reset between
cases so every case compiles its own blocks. The reference is one eager single-device run: compiled blocks equal
eager ones to fp32 rounding (tests/test_trainer.py), so the documented fp32 parity bounds apply unchanged.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from meshlm.config.loader import config_to_toml, load_config
from meshlm.distributed.parity import GRAD_NORM_RTOL, LOSS_RTOL
from meshlm.distributed.teardown import end_rank
from meshlm.train.run_dir import init_run_dir
from meshlm.train.trainer import Trainer
from helpers import once_per_session

STEPS = 2
CASES = {
    "tp2-sp-full-ac": ["parallel.tp=2", "parallel.dp_shard=1", "training.activation_checkpointing=full"],
    "tp2-nosp-selective-ac": ["parallel.tp=2", "parallel.dp_shard=1", "parallel.sequence_parallel=false",
                              "training.activation_checkpointing=selective"],
    "pp2-1f1b-full-ac": ["parallel.pp=2", "parallel.dp_shard=1", "parallel.pp_schedule=1f1b",
                         "training.activation_checkpointing=full"],
}


def _cfg(dataset, *overrides: str):
    base = [f'data.path="{dataset}"', "data.seq_len=32", "training.batch_size=4", f"training.steps={STEPS}",
            "training.eval_interval=0", "checkpoint.enabled=false", "metrics.interval=1",
            "metrics.tensorboard=false", "metrics.progress=plain", "schedule.warmup_steps=1"]
    return load_config(None, [*base, *overrides])


def _run(cfg, run_dir) -> tuple[list[tuple[float, float]], Trainer]:
    """STEPS training steps: (loss, grad norm) per step, and the trainer."""
    init_run_dir(run_dir, config_to_toml(cfg), resume=False)
    trainer = Trainer(cfg, run_dir)
    rows = []
    for _ in range(STEPS):
        record = trainer.train_step()
        rows.append((float(record["loss"]), float(record["grad_norm"])))
    return rows, trainer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, dataset: str, tmp: str, result: dict) -> None:
    from torch._dynamo.utils import counters

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for name, overrides in CASES.items():
            torch._dynamo.reset()
            counters.clear()
            start = time.perf_counter()
            cfg = _cfg(dataset, "training.compile=true", *overrides)
            rows, trainer = _run(cfg, f"{tmp}/{name}/rank{rank}")
            blocks = [b for part in trainer.model_parts for b in part.layers.values()]
            ac_wrapped = all(type(b).__name__ == "CheckpointWrapper" for b in blocks)
            compiled = sum(1 for b in blocks for m in b.modules() if getattr(m, "_compiled_call_impl", None))
            if rank == 0:
                result[name] = {"rows": rows, "graphs": counters["stats"]["unique_graphs"],
                                "graph_breaks": sum(counters["graph_break"].values()),
                                "ac_wrapped": ac_wrapped, "compiled_blocks": compiled, "blocks": len(blocks),
                                "seconds": time.perf_counter() - start}
            dist.barrier()
    finally:
        dist.destroy_process_group()
    end_rank(0)  # gloo's threads can abort an interpreter exit (meshlm/distributed/teardown.py)


def _compile_cases(tmp: Path, dataset: str) -> dict:
    with mp.Manager() as manager:
        result = manager.dict()
        mp.spawn(_worker, args=(2, _free_port(), dataset, str(tmp), result), nprocs=2, join=True)
        return dict(result)


@pytest.fixture(scope="module")
def compiled_runs(debug_dataset, tmp_path_factory) -> dict:
    """Every case's result, computed once per session (xdist may give this module's tests to both workers)."""
    return once_per_session(tmp_path_factory, "compile-layouts",
                            lambda tmp: _compile_cases(tmp, str(debug_dataset)))


@pytest.fixture(scope="module")
def reference(debug_dataset, tmp_path_factory) -> list[tuple[float, float]]:
    """The eager single-device run on the same seed and data."""
    rows, _ = _run(_cfg(debug_dataset), tmp_path_factory.mktemp("reference") / "run")
    return rows


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_layout_matches_single_device(name, compiled_runs, reference):
    case = compiled_runs[name]
    # really compiled (not a silent eager fallback) and really checkpointed
    assert case["graphs"] >= 1 and case["graph_breaks"] == 0, case
    assert case["compiled_blocks"] == case["blocks"] > 0 and case["ac_wrapped"], case
    assert len(case["rows"]) == len(reference) == STEPS
    for (loss, grad_norm), (ref_loss, ref_grad_norm) in zip(case["rows"], reference):
        assert abs(loss - ref_loss) / ref_loss <= LOSS_RTOL, (name, loss, ref_loss)
        assert abs(grad_norm - ref_grad_norm) / ref_grad_norm <= GRAD_NORM_RTOL, (name, grad_norm, ref_grad_norm)
