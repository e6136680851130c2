"""The distributed engine on gloo/CPU: every layout trains like a single device, resumes across layouts, and
survives a killed rank. Multi-process through the CLI (torchrun's elastic agent), as users run it; the parity
matrix runs its cases of one world size in one launch of that agent (tests/parity_batch.py), each case
checked as `meshlm diagnose parity` checks it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshlm.config.loader import load_config
from meshlm.distributed.parallel_dims import ParallelDims
from meshlm.errors import ConfigError
from helpers import meshlm, once_per_session
from parity_batch import Case, run_cases

CFG = "configs/debug.toml"
QUIET = ["--set", "metrics.tensorboard=false", "--set", "metrics.progress=plain"]


def sets(**degrees) -> list[str]:
    return [a for k, v in degrees.items() for a in ("--set", f"{k.replace('__', '.')}={v}")]


LAYOUTS = {
    "ddp2": (2, sets(parallel__dp_replicate=2, parallel__dp_shard=1)),
    "fsdp2": (2, sets(parallel__dp_shard=2)),
    "fsdp4": (4, sets(parallel__dp_shard=4)),
    "fsdp2-accum": (2, sets(parallel__dp_shard=2, training__micro_batch_size=2)),
    "hsdp2x2": (4, sets(parallel__dp_replicate=2, parallel__dp_shard=2)),
    "tp2-sp": (2, sets(parallel__tp=2, parallel__dp_shard=1)),
    "tp2-nosp": (2, sets(parallel__tp=2, parallel__dp_shard=1, parallel__sequence_parallel="false")),
    "tp2-qk-norm": (2, sets(parallel__tp=2, parallel__dp_shard=1, model__qk_norm="true")),  # head-shared norm grads
    "pp2-gpipe": (2, sets(parallel__pp=2, parallel__dp_shard=1, parallel__pp_schedule="gpipe")),
    "pp2-1f1b": (2, sets(parallel__pp=2, parallel__dp_shard=1, parallel__pp_schedule="1f1b")),
    "pp2-interleaved": (2, sets(parallel__pp=2, parallel__dp_shard=1, parallel__pp_schedule="interleaved-1f1b")),
    "pp2-interleaved-zb": (2, sets(parallel__pp=2, parallel__dp_shard=1, parallel__pp_schedule="interleaved-zb")),
    "pp2-zbv": (2, sets(parallel__pp=2, parallel__dp_shard=1, parallel__pp_schedule="zbv")),
    "fsdp2xtp2": (4, sets(parallel__dp_shard=2, parallel__tp=2)),
    "pp2xfsdp2": (4, sets(parallel__pp=2, parallel__dp_shard=2)),
    "pp2xtp2": (4, sets(parallel__pp=2, parallel__tp=2, parallel__dp_shard=1)),
    "pp2xfsdp2xtp2": (8, sets(parallel__pp=2, parallel__dp_shard=2, parallel__tp=2)),
    "fsdp2-selective-ac": (2, sets(parallel__dp_shard=2, training__activation_checkpointing="selective")),
    "pp2-full-ac": (2, sets(parallel__pp=2, parallel__dp_shard=1, training__activation_checkpointing="full")),
    "tp2-selective-ac": (2, sets(parallel__tp=2, parallel__dp_shard=1, training__activation_checkpointing="selective")),
    "ddp2-accum": (2, sets(parallel__dp_replicate=2, parallel__dp_shard=1, training__micro_batch_size=2)),
    "hsdp2x2-accum": (4, sets(parallel__dp_replicate=2, parallel__dp_shard=2, training__micro_batch_size=1)),
}


def parity_reports(tmp_path_factory, name: str, cases: dict[str, Case]) -> dict[str, dict]:
    """What `meshlm diagnose parity --json` reports for each case, all cases of one world size in one launch
    (tests/parity_batch.py), once per session."""
    return once_per_session(tmp_path_factory, name, lambda work: run_cases(cases, work))


def parity_case(nproc: int, args: list[str], steps: int, **tolerances) -> Case:
    """`meshlm diagnose parity CFG --nproc NPROC --steps STEPS ARGS` (ARGS: --set pairs)."""
    assert args[::2] == ["--set"] * (len(args) // 2)
    return Case(nproc, args[1::2], steps, CFG, **tolerances)


@pytest.fixture(scope="module")
def layout_reports(debug_dataset, tmp_path_factory) -> dict[str, dict]:
    return parity_reports(tmp_path_factory, "parallel-layouts",
                          {name: parity_case(nproc, args, 4) for name, (nproc, args) in LAYOUTS.items()})


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_device(name, layout_reports):
    """Per-step loss and grad norm of the layout vs a single device on the same seed and data (fp32).
    Tolerance: meshlm.distributed.parity (loss 1e-4, grad norm 1e-3 relative; measured ~1e-7 / ~1e-5)."""
    report = layout_reports[name]
    assert report["ok"], report
    assert [r["step"] for r in report["steps"]] == [1, 2, 3, 4]
    assert report["max_loss_rel_diff"] < 1e-5  # far inside the documented bound: a real regression shows


LOW_PRECISION = {
    "fsdp2": sets(parallel__dp_shard=2),
    "tp2": sets(parallel__tp=2, parallel__dp_shard=1),
    "pp2": sets(parallel__pp=2, parallel__dp_shard=1),
}


PRECISIONS = ["bf16", "fp16"]


@pytest.fixture(scope="module")
def low_precision_reports(debug_dataset, tmp_path_factory) -> dict[str, dict]:
    return parity_reports(tmp_path_factory, "parallel-low-precision", {
        f"{layout}-{precision}": parity_case(2, [*args, *sets(training__precision=precision)], 2,
                                             loss_rtol=1e-2, grad_norm_rtol=5e-2)
        for layout, args in LOW_PRECISION.items() for precision in PRECISIONS})


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("layout", list(LOW_PRECISION))
def test_low_precision_tracks_the_single_device_run_of_that_precision(layout, precision, low_precision_reports):
    """Mixed precision (FSDP2: low-precision all-gathered params, fp32 reduce; TP/PP: autocast on each rank; fp32
    master weights everywhere; fp16 with the dynamic loss scaler) against the single-device run of the same
    precision: equal to that precision's rounding, the documented low-precision bound (1e-2 relative loss,
    5e-2 grad norm). 2 steps: the second step's loss already carries the first update in that precision."""
    report = low_precision_reports[f"{layout}-{precision}"]
    assert report["ok"], report
    assert [r["step"] for r in report["steps"]] == [1, 2]


COMPILED = {
    "fsdp2": LOW_PRECISION["fsdp2"],
    "tp2-sp": LOW_PRECISION["tp2"],
    "tp2-nosp": sets(parallel__tp=2, parallel__dp_shard=1, parallel__sequence_parallel="false"),
}


@pytest.fixture(scope="module")
def compiled_reports(debug_dataset, tmp_path_factory) -> dict[str, dict]:
    return parity_reports(tmp_path_factory, "parallel-compiled", {
        layout: parity_case(2, [*args, *sets(training__compile="true")], 2) for layout, args in COMPILED.items()})


@pytest.mark.parametrize("layout", list(COMPILED))
def test_compiled_blocks_match_the_single_device_compiled_run(layout, compiled_reports):
    """training.compile=true (per-block torch.compile, applied after TP and before FSDP) against a compiled
    single device; 2 steps because inductor's CPU compile takes most of a minute here. fp32 tolerance."""
    report = compiled_reports[layout]
    assert report["ok"], report
    assert [r["step"] for r in report["steps"]] == [1, 2]


def test_fsdp_collective_bytes_are_exact(debug_dataset, tmp_path):
    """FSDP2 over 2 ranks: gradients are reduce-scattered once (4 bytes per parameter) per unit (every block, the
    embedding, the final norm + head); parameters are gathered once in forward and again in backward for every
    block but the last (kept) and for the embedding; the head is not resharded.
    The gradient-norm reduction DTensor runs inside its own dispatch is counted too, apart (comm_dtensor).
    Communication is sampled (steps 2 and 5 with metrics.comm_sample_interval=3) and every record says which
    step its figures were measured on; MFU stays within 100% with 2 ranks on these cores."""
    from meshlm.models import flavor_config

    run = tmp_path / "run"
    meshlm("train", CFG, "--nproc", "2", *sets(parallel__dp_shard=2, training__steps=6, metrics__interval=1,
                                                metrics__comm_sample_interval=3), *QUIET, "--run-dir", str(run))
    records = _records(run)
    assert "comm_bytes_per_step" not in records[1]  # before the first sample: nothing to report
    assert [records[s]["comm_measured_step"] for s in range(2, 7)] == [2, 2, 2, 5, 5]
    assert all(0 < r["mfu"] <= 1 for r in records.values())
    record = records[6]
    cfg = flavor_config("debug")
    params = cfg.num_params()
    # everything but the embedding, the (untied) head and the final norm, per block
    block = (cfg.num_params(include_embedding=False) - cfg.vocab_size * cfg.dim - cfg.dim) // cfg.n_layers
    comm = record["comm"]
    assert comm["reduce_scatter"] == {"calls": cfg.n_layers + 2, "bytes": 4 * params}
    embedding = cfg.vocab_size * cfg.dim
    # forward: every block, the embedding and the head; backward: every block but the last, and the embedding
    assert comm["all_gather"] == {"calls": (cfg.n_layers + 2) + (cfg.n_layers - 1) + 1,
                                  "bytes": 4 * (params + (cfg.n_layers - 1) * block + embedding)}
    # inside DTensor's dispatch: the grad-norm all-reduce of one fp32 partial norm per parameter tensor (per block
    # 7 matrices and 2 norms; the embedding, final norm and head)
    num_param_tensors = 9 * cfg.n_layers + 3
    assert record["comm_dtensor"] == {"all_reduce": {"calls": 1, "bytes": 4 * num_param_tensors}}
    assert record["comm_wire_bytes_per_step"] < record["comm_bytes_per_step"]  # ring factor (n-1)/n = 1/2
    assert 0 < record["comm_share"] <= 1


def test_sequence_parallel_norm_grads_are_reduced_once_per_step(debug_dataset, tmp_path):
    """tp2 with sequence parallelism, no FSDP: the norm weights' Partial gradients are all-reduced once each, by
    the engine after backward (4·dim bytes per norm: 2 per block and the final one), and not again by the
    grad-norm or the AdamW ops. What DTensor still runs inside its own dispatch is exactly the loss-parallel
    cross-entropy (3 reductions of one fp32 per token) and one grad-norm all-reduce (one fp32 per parameter
    tensor)."""
    from meshlm.models import flavor_config

    run = tmp_path / "run"
    meshlm("train", CFG, "--nproc", "2", *sets(parallel__tp=2, parallel__dp_shard=1, training__steps=2,
                                                metrics__interval=1, metrics__comm_sample_interval=1),
           *QUIET, "--run-dir", str(run))
    record = _records(run)[2]
    cfg = flavor_config("debug")
    norms = 2 * cfg.n_layers + 1
    assert record["comm"]["all_reduce"] == {"calls": norms, "bytes": 4 * cfg.dim * norms}
    tokens = 8 * 64  # debug.toml: 8 sequences of 64 tokens, the whole batch on both TP ranks
    num_param_tensors = 9 * cfg.n_layers + 3
    assert record["comm_dtensor"] == {"all_reduce": {"calls": 3 + 1, "bytes": 3 * 4 * tokens + 4 * num_param_tensors}}


def _records(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("first, second", [
    ((4, sets(parallel__dp_shard=4)), (4, sets(parallel__tp=2, parallel__dp_shard=2))),
    ((2, sets(parallel__pp=2, parallel__dp_shard=1)), (1, [])),
], ids=["fsdp4-to-tp2xfsdp2", "pp2-to-pp1"])
def test_resume_across_layouts(first, second, debug_dataset, tmp_path):
    common = [CFG, *sets(training__steps=6, checkpoint__interval=3, metrics__interval=1), *QUIET]
    reference = tmp_path / "reference"
    meshlm("train", *common, "--run-dir", str(reference))
    run = tmp_path / "run"
    nproc, args = first
    meshlm("train", *common, *args, "--nproc", str(nproc), "--stop-at", "3", "--run-dir", str(run))
    nproc, args = second
    out = meshlm("train", *common, *args, *(["--nproc", str(nproc)] if nproc > 1 else []), "--resume", "auto",
                 "--run-dir", str(run))
    assert "resumed from" in out.stdout + out.stderr
    ref, got = _records(reference), _records(run)
    assert sorted(got) == list(range(1, 7))
    for step in range(1, 7):  # the same global data order and the same weights: the same losses
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=1e-5), step


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def test_killed_rank_restarts_and_matches(debug_dataset, tmp_path):
    """SIGKILL one rank mid-run under --max-restarts 1: the job restarts, resumes from the newest valid
    checkpoint and ends with bitwise the same weights as an uninterrupted run of the same layout."""
    common = [CFG, "--nproc", "2", *sets(parallel__dp_shard=2, training__steps=30, checkpoint__interval=4,
                                          parallel__timeout_s=60,
                                          metrics__interval=1, data__seq_len=128, training__batch_size=16), *QUIET]
    clean = tmp_path / "clean"
    meshlm("train", *common, "--run-dir", str(clean))
    run = tmp_path / "killed"
    launcher = subprocess.Popen([sys.executable, "-m", "meshlm", "train", *common, "--max-restarts", "1",
                                 "--run-dir", str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.time() + 300
    while killed is None and time.time() < deadline and launcher.poll() is None:
        metrics = run / "metrics.jsonl"
        steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()] if metrics.exists() else []
        if steps and steps[-1] >= 10:
            workers = _children(launcher.pid)
            if workers:
                killed = workers[-1]
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.02)
    out, err = launcher.communicate(timeout=600)
    assert killed is not None, "the run finished before a rank could be killed"
    assert launcher.returncode == 0, err[-3000:]
    assert "resumed from" in out + err
    final, reference = _inspect(run), _inspect(clean)
    assert final["step"] == reference["step"] == 30
    assert final["weights_sha256"] == reference["weights_sha256"]


def _inspect(run: Path) -> dict:
    """The step and weights_sha256 that `meshlm inspect RUN --json` reports (the same calls, in this process)."""
    from meshlm.checkpoint.load import model_from_checkpoint, weights_sha256

    model, _, state, _ = model_from_checkpoint(run)
    return {"step": state["step"], "weights_sha256": weights_sha256(model)}


def test_dead_rank_without_restarts_is_reported(debug_dataset, tmp_path):
    """Only rank 1 fails: its own RNG file in the checkpoint is garbage (the manifest was written for that
    content, so rank 0's verification passes and only rank 1's load fails). The job ends, and the report names
    rank 1 and its error; rank 0 is reported as stopped by the agent, not as the failure."""
    import hashlib

    run = tmp_path / "run"
    common = [CFG, "--nproc", "2", *sets(parallel__dp_shard=2, checkpoint__interval=2), *QUIET, "--run-dir", str(run)]
    meshlm("train", *common, *sets(training__steps=2))
    ckpt = run / "checkpoints" / "step-00000002"
    garbage = b"not a torch file"
    (ckpt / "rng" / "rank-00001.pt").write_bytes(garbage)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["rng/rank-00001.pt"].update(bytes=len(garbage), sha256=hashlib.sha256(garbage).hexdigest())
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    proc = meshlm("train", *common, *sets(training__steps=4, parallel__timeout_s=60), "--resume", "auto",
                  check=False)
    assert proc.returncode != 0
    report = proc.stderr.strip().splitlines()[-1]  # "training failed ...: rank 0 (pid N) was killed by ...; ..."
    failures = dict(re.findall(r"rank (\d+) \(pid \d+\) ([^;]+)", report))
    assert failures.get("1", "").startswith("exited with code"), report  # its own error, not the agent's signal
    assert failures.get("0", "was killed").startswith("was killed"), report  # stopped by the agent, if listed
    assert "Traceback" not in report


@pytest.mark.parametrize("overrides, world, message", [
    (["parallel.tp=3"], 4, "does not divide the 4 ranks"),
    (["parallel.dp_shard=2", "parallel.tp=2"], 8, "= 4 ranks, but the job has 8"),
])
def test_impossible_world_sizes(overrides, world, message):
    with pytest.raises(ConfigError, match=message):
        ParallelDims.from_config(load_config(None, overrides).parallel, world)


@pytest.mark.parametrize("overrides, world, message", [
    (["parallel.tp=8", "parallel.dp_shard=1"], 8, "model.n_heads (4) is not divisible by parallel.tp (8)"),
    (["parallel.pp=4", "parallel.dp_shard=1", "parallel.pp_schedule=interleaved-1f1b"], 4,
     "model.n_layers (4) is fewer than the 8 pipeline stages"),
    (["parallel.pp=2", "parallel.dp_shard=1", "parallel.microbatches=3"], 2, "not divisible into parallel.microbatches"),
    (["parallel.pp=2", "parallel.dp_shard=1", "parallel.stages_per_rank=2", "parallel.pp_schedule=1f1b"], 2,
     "runs one stage per rank"),
    (["parallel.tp=2", "parallel.dp_shard=1", "data.seq_len=63"], 2, "not divisible by parallel.tp (2) for sequence"),
])
def test_impossible_layouts_name_the_key(overrides, world, message):
    cfg = load_config(None, overrides)
    dims = ParallelDims.from_config(cfg.parallel, world)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dims.validate_model(cfg.model, cfg.parallel, cfg.data.seq_len, cfg.training.batch_size // dims.dp)


def test_cli_rejects_bad_layout_before_spawning(tmp_path):
    proc = meshlm("train", CFG, "--nproc", "4", "--set", "parallel.tp=3", "--run-dir", str(tmp_path / "r"),
                  check=False)
    assert proc.returncode == 2 and "does not divide the 4 ranks" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_missing_rendezvous_peer_fails_within_the_timeout(debug_dataset, tmp_path):
    """Rank 0 of a 2-rank job whose peer never starts: one clear line after parallel.timeout_s, no hang."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "PYTHONWARNINGS": "ignore"}
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "meshlm", "train", CFG, *sets(parallel__dp_shard=2,
                           parallel__timeout_s=3), "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert time.time() - start < 60
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert "rank 0 could not join the 2-rank process group" in last and "parallel.timeout_s=3s" in last
