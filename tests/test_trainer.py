"""The trainer: loss falls, bitwise resume, accumulation invariance, precision modes, activation checkpointing."""

from __future__ import annotations

import pytest
import torch

from meshlm.checkpoint.load import weights_sha256
from meshlm.config.loader import config_to_toml, load_config
from meshlm.train.run_dir import init_run_dir
from meshlm.train.trainer import Trainer, host_values


def _cfg(dataset, *overrides):
    base = [f'data.path="{dataset}"', "data.seq_len=32", "training.batch_size=4", "training.steps=6",
            "training.eval_interval=0", "checkpoint.interval=3", "metrics.interval=1", "metrics.tensorboard=false",
            "metrics.progress=plain", "schedule.warmup_steps=2"]
    return load_config(None, [*base, *overrides])


def _trainer(cfg, run_dir, **kwargs) -> Trainer:
    init_run_dir(run_dir, config_to_toml(cfg), resume=kwargs.get("resume", False))
    return Trainer(cfg, run_dir, **kwargs)


def test_loss_falls(debug_dataset, tmp_path):
    cfg = _cfg(debug_dataset, "training.steps=30", "checkpoint.enabled=false", "optimizer.lr=3e-3",
               "training.batch_size=8")
    trainer = _trainer(cfg, tmp_path / "run")
    first = float(trainer.train_step()["loss"])  # records hold device tensors until logged
    trainer.train()
    import json
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 30
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu"} <= set(records[-1])
    assert sum(r["loss"] for r in records[-5:]) / 5 < first - 0.7  # ln(2048) = 7.6 -> ~6.6 nats


def test_bitwise_resume(debug_dataset, tmp_path):
    """2N steps in one run == N steps, a resume from the checkpoint, and N more: identical bytes."""
    cfg = _cfg(debug_dataset)
    straight = _trainer(cfg, tmp_path / "a")
    straight.train()
    stopped = _trainer(cfg, tmp_path / "b", stop_at=3)
    stopped.train()
    assert stopped.step == 3
    resumed = _trainer(cfg, tmp_path / "b", resume=True)
    assert resumed.step == 3
    resumed.train()
    assert resumed.step == 6
    assert weights_sha256(resumed.model) == weights_sha256(straight.model)
    for (name, a), b in zip(straight.optimizers[0].state.items(), resumed.optimizers[0].state.values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])


def test_gradient_accumulation_invariance(debug_dataset, tmp_path):
    """Batch 8 in one micro-step vs 4 micro-steps of 2: the same loss and the same accumulated gradient.

    Gradients are compared rather than post-AdamW weights: Adam's first update is ~lr·sign(g), so elements whose
    gradient is ~0 turn fp32 summation-order noise into differences of up to 2·lr, whatever the accumulation.
    """
    losses, grads = {}, {}
    for micro in (0, 2):
        cfg = _cfg(debug_dataset, "training.batch_size=8", f"training.micro_batch_size={micro}",
                   "checkpoint.enabled=false")
        trainer = _trainer(cfg, tmp_path / f"m{micro}")
        assert trainer.accum_steps == (1 if micro == 0 else 4)
        trainer.optimizers[0].step = lambda: None  # keep the accumulated gradients for comparison
        trainer.optimizers[0].zero_grad = lambda set_to_none=True: None
        losses[micro] = float(trainer.train_step()["loss"])
        grads[micro] = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
    # One 8-row matmul vs four 2-row ones sum in a different order: equal up to fp32 rounding (measured max
    # abs difference ~2e-8 on gradients of magnitude ~2e-2).
    assert losses[0] == pytest.approx(losses[2], rel=1e-6)
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[2][name], g, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_matches(debug_dataset, tmp_path, mode):
    grads, keys = {}, {}
    for ac in ("none", mode):
        cfg = _cfg(debug_dataset, f"training.activation_checkpointing={ac}", "checkpoint.enabled=false")
        trainer = _trainer(cfg, tmp_path / ac)
        batch = trainer.train_loader.next_batch()
        trainer.forward_backward(batch, 1.0 / batch["labels"].numel())
        grads[ac] = {n.replace("._checkpoint_wrapped_module", ""): p.grad.clone()
                     for n, p in trainer.model.named_parameters()}
        keys[ac] = list(trainer.model.state_dict())
    assert keys["none"] == keys[mode]  # checkpoint names unchanged by the wrapper
    for name, g in grads["none"].items():
        torch.testing.assert_close(grads[mode][name], g, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_trains(debug_dataset, tmp_path, precision):
    cfg = _cfg(debug_dataset, f"training.precision={precision}", "training.steps=3", "checkpoint.enabled=false")
    trainer = _trainer(cfg, tmp_path / precision)
    records = [host_values(trainer.train_step()) for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # fp32 master weights
    assert records[-1]["loss"] < records[0]["loss"]


def test_fp16_overflow_skips_step_and_backs_off(debug_dataset, tmp_path):
    cfg = _cfg(debug_dataset, "training.precision=fp16", "checkpoint.enabled=false")
    trainer = _trainer(cfg, tmp_path / "fp16")
    trainer.scaler.scale = 3e38  # scaled loss overflows fp32 -> inf gradients
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    record = trainer.train_step()
    assert record["skipped"] is True
    assert trainer.scaler.scale == pytest.approx(1.5e38)
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    assert trainer.step == 1  # the schedule still advances


def test_init_from_checkpoint_starts_from_its_weights(debug_dataset, tmp_path):
    """checkpoint.init_from (fine-tuning): weights come from the checkpoint, step and optimizer start fresh."""
    source = _trainer(_cfg(debug_dataset, "training.steps=3"), tmp_path / "source")
    source.train()
    cfg = _cfg(debug_dataset, f'checkpoint.init_from="{tmp_path / "source"}"', "checkpoint.enabled=false")
    tuned = _trainer(cfg, tmp_path / "tuned")
    assert tuned.step == 0 and not tuned.optimizers[0].state
    assert weights_sha256(tuned.model) == weights_sha256(source.model)


def test_compiled_blocks_train_like_eager(debug_dataset, tmp_path):
    """training.compile compiles each block (inductor, CPU C++ codegen): same losses as eager within fp32
    rounding (fused kernels reorder sums)."""
    losses = {}
    for compiled in (False, True):
        cfg = _cfg(debug_dataset, f"training.compile={str(compiled).lower()}", "checkpoint.enabled=false")
        trainer = _trainer(cfg, tmp_path / str(compiled))
        losses[compiled] = [float(trainer.train_step()["loss"]) for _ in range(2)]
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)


def test_wandb_offline_logging(debug_dataset, tmp_path, monkeypatch):
    """metrics.wandb: an offline W&B run under RUN_DIR/wandb (skipped where wandb is not installed)."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = _cfg(debug_dataset, "metrics.wandb=true", "training.steps=2", "checkpoint.enabled=false")
    _trainer(cfg, tmp_path / "run").train()
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
