"""The troubleshooting doctor: `diagnose oom` (planner memory, remedies in order, a config that trains), the
out-of-memory error of a training step, `diagnose parity`'s named checks (one 2-rank FSDP parity run, reused by
`diagnose slow` and its profiled copy), and the check logic on records that must fail."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from meshlm.config.loader import load_config
from meshlm.doctor import oom, parity_checks, slow
from meshlm.errors import UserError
from helpers import meshlm

CFG = "configs/debug.toml"
QUIET = ["metrics.tensorboard=false", "metrics.progress=plain", "checkpoint.enabled=false", "training.eval_interval=0"]


# ------------------------------------------------------------------------------------------------ oom
def test_oom_ladder_for_a_model_that_needs_sharding(tmp_path):
    """Llama 3 8B with plain DDP over 8 x A100 80 GB: states alone are 16 bytes/param. The remedies come in the
    taught order; micro-batching and checkpointing shrink activations only; sharding is the first that fits,
    and its config (same global batch, dp_shard 8) loads."""
    cfg = tmp_path / "l8b.toml"
    cfg.write_text('[model]\nflavor = "llama3-8b"\n[data]\nseq_len = 4096\n[training]\nbatch_size = 64\n'
                   'precision = "bf16"\n[parallel]\ndp_replicate = 8\ndp_shard = 1\n')
    fit = tmp_path / "fit.toml"
    report = oom.diagnose(str(cfg), [], 8, "a100-80gb", None, 0.9, str(fit))
    assert not report["fits"] and report["predicted"]["memory_gib"]["total"] > report["usable_gib"]
    rows = report["remedies"]
    assert [r["remedy"] for r in rows] == list(oom.REMEDIES)
    base = report["predicted"]["memory_gib"]
    assert rows[0]["memory_gib"]["activations"] < base["activations"]
    assert rows[0]["memory_gib"]["optimizer"] == base["optimizer"]  # accumulation leaves the states alone
    assert not rows[0]["fits"] and not rows[1]["fits"] and rows[2]["fits"]
    assert rows[1]["step_time_ratio"] > 1.2  # full recomputation costs about a third more compute
    assert report["recommended"] == "sharding" and rows[2]["memory_gib"]["total"] <= report["usable_gib"]
    emitted = load_config(fit)
    assert emitted.parallel.dp_shard == 8 and emitted.parallel.dp_replicate == 1
    assert emitted.training.batch_size == 64  # the global batch is kept


def test_oom_fits_and_cli_json():
    out = json.loads(meshlm("diagnose", "oom", CFG, "--gpu", "a100-40gb", "--json").stdout)
    assert out["fits"] and out["recommended"] is None and out["emitted_config"] is None
    with pytest.raises(UserError, match="--nproc"):  # exit 2 from the CLI, one line
        oom.diagnose(CFG, [], 0, "a100-40gb", None, 0.9, None)


def test_oom_emitted_config_trains_and_a_real_oom_names_the_command(tmp_path, debug_dataset):
    """The debug config on a device of 0.02 GiB: a smaller micro-batch is the first remedy; the emitted config
    trains. Then a real allocator failure inside a step becomes the one-line error with the breakdown."""
    from meshlm.doctor.callbacks import run_callbacks
    from meshlm.train.run_dir import init_run_dir
    from meshlm.train.trainer import Trainer

    fit = tmp_path / "fit.toml"
    report = oom.diagnose(CFG, [], 1, "a100-40gb", 0.02, 0.9, str(fit))
    assert not report["fits"] and report["recommended"] == "micro-batch"
    cfg = load_config(fit, [*QUIET, "training.steps=2", "metrics.interval=1"])
    assert 0 < cfg.training.micro_batch_size < cfg.training.batch_size == 8
    init_run_dir(tmp_path / "run", "", resume=False)
    trainer = Trainer(cfg, tmp_path / "run", callbacks=run_callbacks(cfg))
    loss_sum = trainer.objective.loss_sum

    def exhausting(model, batch):
        if trainer.step == 1:  # the second step asks the CPU allocator for an exabyte
            torch.empty(1 << 60, dtype=torch.uint8)
        return loss_sum(model, batch)

    trainer.objective.loss_sum = exhausting
    with pytest.raises(oom.OutOfMemory) as err:
        trainer.train()
    text = str(err.value)
    assert trainer.step == 1  # the emitted config trained a step before the injected failure
    assert "out of memory in step 2" in text and "meshlm diagnose oom" in text and "activations" in text
    assert "\n" not in text
    assert not oom.is_out_of_memory(RuntimeError("shape mismatch"))


# --------------------------------------------------------------------------------------------- parity
@pytest.fixture(scope="module")
def parity_run(tmp_path_factory, debug_dataset):
    """One 2-rank FSDP parity run of 2 steps (the layout's run directory is reused by `diagnose slow`)."""
    work = tmp_path_factory.mktemp("parity")
    out = meshlm("diagnose", "parity", CFG, "--nproc", "2", "--steps", "2", "--set", "parallel.dp_shard=2",
                 "--work-dir", str(work), "--json")
    return work, json.loads(out.stdout)


def test_parity_reports_each_cause_by_name(parity_run):
    _, report = parity_run
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) == {"init_matches_single_device", "init_covers_model", "data_shards_disjoint",
                           "data_covers_batch", "data_epoch_partition", "dropout_settings", "dropout_rng_streams"}
    assert all(c["status"] == "pass" for c in checks.values()), checks
    assert report["ok"]


def test_parity_checks_fail_on_what_they_guard(parity_run):
    """The same probes, altered as the bugs would alter them: a rank initialised from another seed, two ranks
    reading the same samples, an epoch shard that misses windows, dropout with one RNG stream on every rank."""
    work, _ = parity_run
    ref = parity_checks.read_probes(work / "reference")[0]
    ranks = parity_checks.read_probes(work / "layout")
    assert len(ranks) == 2

    def status(checks, name):
        return next(c["status"] for c in checks if c["name"] == name)

    bad = copy.deepcopy(ranks)
    name = next(iter(bad[1]["params"]))
    bad[1]["params"][name] = "0" * 64
    assert status(parity_checks.init_checks(ref, bad), "init_matches_single_device") == "fail"
    bad = copy.deepcopy(ranks)
    bad[1]["steps"][0]["samples"] = bad[0]["steps"][0]["samples"]
    checks = parity_checks.data_checks(ref, bad)
    assert status(checks, "data_shards_disjoint") == "fail" and status(checks, "data_covers_batch") == "fail"
    bad = copy.deepcopy(ranks)
    bad[1]["epoch"]["windows"] = bad[0]["epoch"]["windows"]
    assert status(parity_checks.data_checks(ref, bad), "data_epoch_partition") == "fail"
    bad = copy.deepcopy(ranks)
    for r in bad:
        r["dropout"] = [{"module": "layers.0.attention.wq.lora_dropout", "p": 0.1}]
    checks = parity_checks.dropout_checks(bad)
    # the trainer gives each data-parallel rank its own RNG stream, so dropout masks differ between ranks ...
    assert status(checks, "dropout_settings") == "warn" and status(checks, "dropout_rng_streams") == "pass"
    bad[1]["rng"] = bad[0]["rng"]  # ... and one shared stream is what the check warns about
    assert status(parity_checks.dropout_checks(bad), "dropout_rng_streams") == "warn"


# ----------------------------------------------------------------------------------------------- slow
def test_slow_from_metrics_and_a_profiled_copy(parity_run, tmp_path):
    """`diagnose slow` on the parity layout run: per-rank timings gathered by the trainer, the sampled step's
    communication and optimizer shares, the planner's prediction; then a profiled copy of 1 step."""
    work, _ = parity_run
    report = slow.diagnose(str(work / "layout"), None, tmp_path)
    assert report["nproc"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    m = report["measured"]
    assert 0 < m["comm_share"] < 1 and 0 < m["optimizer_share"] < 1 and 0 <= m["data_wait_share"] < 1
    assert report["predicted"]["step_time_s"] > 0 and report["predicted"]["bubble"] == 0
    assert all(r["busy_s"] > 0 and r["comm_s"] > 0 for r in report["ranks"])
    out = json.loads(meshlm("diagnose", "slow", str(work / "layout"), "--profile", "1", "--work-dir",
                            str(tmp_path / "p"), "--json").stdout)
    assert out["measured"]["profiled_steps"] and "afresh" in out["source"]
    assert len(out["traces"]) == 2  # one chrome trace per rank
    assert all(r["profiled_step_s"] > r["comm_s"] > 0 for r in out["ranks"])


def test_straggler_is_named_with_a_reason():
    """Synchronous ranks have equal wall step times; the straggler is the rank with the most busy time."""
    rec = {"step_time_s": 1.0, "tokens_per_s": 1.0, "comm_measured_step": 2, "measured_step_s": 1.0,
           "comm_s": 0.5, "optimizer_s": 0.01, "data_wait_s": 0.0,
           "per_rank": {"step_time_s": [1.0, 1.0, 1.0], "data_wait_s": [0.0] * 3, "measured_step_s": [1.0] * 3,
                        "comm_s": [0.6, 0.1, 0.6], "optimizer_s": [0.01] * 3}}
    ranks = slow.per_rank([rec, rec])
    assert slow.stragglers(ranks) == [1]
    cfg = load_config(CFG, ["parallel.dp_shard=3"])
    pred, layout = slow.predicted(cfg, 3, {})
    recs = slow.recommend(cfg, layout, slow.measured([rec, rec]), pred, [1], ranks)
    assert any("rank 1" in r["change"] for r in recs)
    assert any("collectives take 50%" in r["why"] for r in recs)
    # two pipeline stages do different work: imbalance is reported per stage, not as a straggler
    staged = [dict(r, busy_s=b) for r, b in zip(ranks[:2], (0.1, 0.4))]
    assert slow.stage_balance(staged, 2) == [0.1, 0.4] and slow.stragglers(staged, 2) == []
