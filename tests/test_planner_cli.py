"""`meshlm plan` and the planner library predict alike: Megatron's Table 1 (tests/test_planner.py) calibrated and
predicted through the CLI (`--efficiency`, `--fix`, `--json`, in-process) gives the library's efficiency and the
library's figure for every row. Until pinning `micro_batch_size` meant the same under pipelining, the CLI ran the
pipelined rows with as many micro-batches as stages (the library: one sequence per micro-batch), 28–43% below
the library's figures."""

from __future__ import annotations

import json

import pytest

from helpers import meshlm_in_process
from meshlm.planner.model_spec import GPT_PRESETS
from test_planner import MEGATRON, calibrate_on_7_5b, megatron_tflops


def cli_step(capfd, name: str, tp: int, pp: int, gpus: int, batch: int, efficiency: float) -> dict:
    """The recommendation `meshlm plan --json` reports for a row, pinned to the library test's layout: plain data
    parallelism, full recompute, 1F1B, one sequence per micro-batch, fp16 on A100 80GB."""
    fix = (f"dp_replicate={gpus // (tp * pp)},dp_shard=1,tp={tp},pp={pp},pp_schedule=1f1b,micro_batch_size=1,"
           "sharding=none,ac=full")
    capfd.readouterr()
    result = meshlm_in_process("plan", "--model", name, "--gpus", str(gpus), "--gpu", "a100-80gb", "--seq", "2048",
                               "--global-batch-seqs", str(batch), "--precision", "fp16", "--efficiency",
                               repr(efficiency), "--fix", fix, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(capfd.readouterr().out)["recommended"]


def cli_tflops(capfd, row: tuple, efficiency: float) -> float:
    """Per-GPU TFLOP/s as the paper counts them (as megatron_tflops does) over the CLI's predicted step."""
    name, tp, pp, gpus, batch, _ = row
    step = cli_step(capfd, name, tp, pp, gpus, batch, efficiency)["step_time_s"]
    spec = GPT_PRESETS[name]
    s, l, h, v = 2048, spec.n_layers, spec.dim, spec.vocab_size
    return 96 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)) / (step * gpus) / 1e12


def test_cli_calibration_on_megatron_table1_equals_the_librarys(capfd):
    rows = {row[0]: row for row in MEGATRON}
    steps = 20  # 20 halvings of [0.05, 1]: the efficiency to 1e-6
    lib = calibrate_on_7_5b(lambda e: megatron_tflops(e)["gpt-7.5b"], steps)
    cli = calibrate_on_7_5b(lambda e: cli_tflops(capfd, rows["gpt-7.5b"], e), steps)
    assert cli == lib  # the same bisection over the same step-time model takes the same halves
    library = megatron_tflops(lib)
    for row in MEGATRON:
        name, *_, published = row
        predicted = cli_tflops(capfd, row, cli)
        assert predicted == pytest.approx(library[name], rel=1e-9), name
        assert abs(predicted / published - 1) < 0.10, (name, predicted, published)


def test_pinned_micro_batch_size_sets_the_pipeline_micro_batches(capfd):
    """Under pipelining `--fix micro_batch_size=B` means local batch / B micro-batches (the engine's
    parallel.microbatches); a micro-batch count that disagrees with it is reported, not silently used."""
    name, tp, pp, gpus, batch, _ = next(row for row in MEGATRON if row[0] == "gpt-39b")
    rec = cli_step(capfd, name, tp, pp, gpus, batch, 0.5)
    assert rec["layout"]["microbatches"] == batch // (gpus // (tp * pp))  # 48: one sequence each
    fix = f"tp={tp},pp={pp},micro_batch_size=2,microbatches=8"
    result = meshlm_in_process("plan", "--model", name, "--gpus", str(gpus), "--gpu", "a100-80gb", "--seq", "2048",
                               "--global-batch-seqs", str(batch), "--fix", fix, "--json")
    assert result.returncode == 0, result.stderr
    rec = json.loads(capfd.readouterr().out)["recommended"]
    assert not rec["feasible"] and "not micro_batch_size 2" in rec["reason"]


def test_plan_counts_a_gemma3_model_as_its_config_does(capfd):
    """A Gemma 3 flavour: the plan's parameter count is the config's (four norms and q/k norms per block, the
    tied head once), and its family is named."""
    from meshlm.models import flavor_config

    result = meshlm_in_process("plan", "--model", "gemma3-270m", "--gpus", "2", "--gpu", "h100-80gb", "--seq", "1024",
                               "--global-batch-seqs", "8", "--json")
    assert result.returncode == 0, result.stderr
    model = json.loads(capfd.readouterr().out)["model"]
    assert model["family"] == "gemma3" and model["params"] == flavor_config("gemma3-270m").num_params()
