"""PPO and GRPO (meshlm/objectives/rl.py, rewards.py): reward functions, the value head, the first minibatch of a
rollout (ratio 1: nothing clipped), learning a programmatic reward with bounded KL, bitwise resume from inside a
rollout, and runs under FSDP2 and DDP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from meshlm.checkpoint.load import weights_sha256
from meshlm.config.loader import config_to_toml, load_config
from meshlm.errors import ConfigError
from meshlm.models import build_model, flavor_config, meta_model
from meshlm.objectives.rewards import call_reward_fn, contains_number, load_reward_fn, matches_answer
from meshlm.objectives.rl import PPOObjective
from meshlm.train.run_dir import init_run_dir
from meshlm.train.trainer import Trainer
from tests.helpers import ROOT, meshlm, once_per_session
from tests.parity_batch import Case, run_cases


def _cfg(name: str, *overrides: str):
    base = ["metrics.interval=1", "metrics.tensorboard=false", "metrics.progress=plain", "checkpoint.enabled=false"]
    return load_config(ROOT / "configs" / f"{name}.toml", [*base, *overrides])


def _trainer(cfg, run_dir, **kwargs) -> Trainer:
    init_run_dir(run_dir, config_to_toml(cfg), resume=kwargs.get("resume", False))
    return Trainer(cfg, run_dir, **kwargs)


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------------- rewards
def test_reward_functions_and_their_errors():
    assert contains_number(["p", "p"], ["five", "it is 5"], [{}, {}]) == [0.0, 1.0]
    assert matches_answer(["p", "p"], ["3 apples", "4"], [{"answer": "3"}, {"answer": 3}]) == [1.0, 0.0]
    assert load_reward_fn("meshlm.objectives.rewards:contains_number") is contains_number
    for spec, match in (("nocolon", "module:function"), ("no.such.module:f", "cannot import"),
                        ("meshlm.objectives.rewards:nope", "no function")):
        with pytest.raises(ConfigError, match=match):
            load_reward_fn(spec)
    with pytest.raises(ConfigError, match="one finite number per response"):
        call_reward_fn(lambda p, r, e: [1.0], "m:f", ["a", "b"], ["x", "y"], [{}, {}], torch.device("cpu"))


def test_value_head_leaves_the_logits_unchanged_and_starts_at_zero():
    cfg = flavor_config("debug")
    plain = build_model(cfg, "cpu", seed=3)
    from meshlm.models.init import materialize

    model = meta_model(cfg)
    PPOObjective().adapt_model(model)
    materialize(model, "cpu", 3)
    tokens = torch.randint(0, cfg.vocab_size, (2, 9))
    torch.testing.assert_close(model(tokens), plain(tokens), rtol=0, atol=0)
    assert torch.equal(model.output.take_values(), torch.zeros(2, 9))
    keep = PPOObjective().init_from_keep
    assert keep("output.weight") and not keep("output.value.weight")  # init_from leaves the head at zero


# --------------------------------------------------------------------------------------------- objectives
@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_first_minibatch_has_ratio_one(name, tmp_path):
    """The rollout's old log-probs are the policy's own: before any update the ratio is 1, nothing is clipped
    and the approximate KL to the rollout policy is 0 (up to fp32 rounding of the same forward)."""
    trainer = _trainer(_cfg(name, "training.steps=1"), tmp_path / name)
    objective = trainer.objective
    batch = objective.next_batch(trainer.train_loader)
    assert batch["input_ids"].shape[0] == trainer.cfg.training.batch_size
    assert objective.num_loss_tokens(batch) == batch["response_mask"].sum() > 0
    loss = objective.loss_sum(trainer.model, batch)
    assert torch.isfinite(loss)
    metrics = {k: float(s / c) for k, (s, c) in objective.metrics().items()}
    assert metrics["clip_fraction"] == 0.0 and metrics["approx_kl"] < 1e-10
    assert metrics["kl"] == 0.0  # the reference is the starting policy
    assert 0.0 <= metrics["reward"] <= 1.0 and metrics["rollout_tokens_per_s"] > 0
    if name == "ppo":
        assert "value_loss" in metrics


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_learns_to_answer_with_a_number(name, tmp_path):
    """From the seeded initialisation (reward ~0.15: few tokens contain a digit) the mean reward of the last
    rollouts is well above the first ones', while the KL to the reference stays bounded."""
    trainer = _trainer(_cfg(name), tmp_path / name)  # the shipped config: 24 (GRPO) / 32 (PPO) steps, 4 per rollout
    trainer.train()
    rollouts = [r for r in _records(tmp_path / name) if "reward" in r]  # records of steps that made a rollout
    start, end = rollouts[0]["reward"], sum(r["reward"] for r in rollouts[-2:]) / 2
    steps_per_rollout = trainer.cfg.objective.ppo_epochs * trainer.cfg.objective.ppo_minibatches
    assert len(rollouts) == trainer.cfg.training.steps // steps_per_rollout and end > start + 0.4, (start, end)
    # KL(policy || reference) per response token (k1 estimate at the rollout): it grows as the policy leaves the
    # uniform start (entropy ln 2048 = 7.6 nats) but stays within a few nats (measured: < 2)
    assert max(r["kl"] for r in rollouts) < 3.0
    assert {"entropy", "clip_fraction", "approx_kl", "rollout_tokens_per_s"} <= set(rollouts[-1])


def test_ppo_resumes_bitwise_from_inside_a_rollout(tmp_path):
    """A rollout serves 4 steps (2 epochs x 2 minibatches); a checkpoint at step 3 holds the rollout buffer, and
    the resumed run ends bitwise where the uninterrupted run does, through the next rollout (steps 5-6)."""
    cfg = _cfg("ppo", "training.steps=6", "checkpoint.enabled=true", "checkpoint.interval=3")
    straight = _trainer(cfg, tmp_path / "a")
    straight.train()
    stopped = _trainer(cfg, tmp_path / "b", stop_at=3)
    stopped.train()
    state = json.loads(next((tmp_path / "b" / "checkpoints").glob("step-00000003/train_state.json")).read_text())
    assert state["objective"]["buffer"] is not None and state["objective"]["position"] == 3
    resumed = _trainer(cfg, tmp_path / "b", resume=True)
    resumed.train()
    assert resumed.step == 6
    assert weights_sha256(resumed.model) == weights_sha256(straight.model)
    last = [{k: r[k] for k in ("step", "loss", "grad_norm")} for r in (_records(tmp_path / "a")[-1],
                                                                       _records(tmp_path / "b")[-1])]
    assert last[0] == last[1] and last[0]["step"] == 6


PARITY = {"grpo-fsdp2": ("grpo", ["parallel.dp_shard=2"]),
          "ppo-ddp2": ("ppo", ["parallel.dp_replicate=2", "parallel.dp_shard=1"]),
          "ppo-fsdp2": ("ppo", ["parallel.dp_shard=2"])}


@pytest.fixture(scope="module")
def parity_reports(tmp_path_factory) -> dict[str, dict]:
    """`meshlm diagnose parity configs/NAME.toml --nproc 2 --steps 5 --json --set LAYOUT... --set metrics...` of
    every case, in one launch (tests/parity_batch.py), once per session; each report names its two run folders."""
    cases = {case: Case(2, [*layout, "metrics.interval=1", "metrics.tensorboard=false", "metrics.progress=plain"],
                        5, str(ROOT / "configs" / f"{name}.toml"))
             for case, (name, layout) in PARITY.items()}
    return once_per_session(tmp_path_factory, "rl-parity", lambda work: run_cases(cases, work))


@pytest.mark.parametrize("case", list(PARITY))
def test_parity_with_single_device(case, parity_reports):
    """Sampling is seeded per sequence (global index), prompts are padded to the global width, advantages and
    the minibatch order are computed over the gathered global rollout: two ranks reproduce the single-device
    loss and grad norm within the parity tolerances, through a whole rollout (4 steps) and into the next."""
    report = parity_reports[case]
    assert report["ok"], report
    assert len(report["steps"]) == 5
    records = _records(Path(report["work"]["layout"]))
    rollouts = [r for r in records if "reward" in r]
    assert [r["step"] for r in rollouts] == [1, 5] and all(0.0 <= r["reward"] <= 1.0 for r in rollouts)
    reference = {r["step"]: r for r in _records(Path(report["work"]["reference"]))}
    for r in rollouts:  # the same samples: the same mean reward and response length
        assert r["reward"] == reference[r["step"]]["reward"]
        assert r["response_length"] == reference[r["step"]]["response_length"]


def test_bad_reward_fn_is_a_user_error(tmp_path):
    proc = meshlm("train", "configs/grpo.toml", "--run-dir", str(tmp_path / "bad"), "--set",
                  "objective.reward_fn=nowhere:fn", check=False)
    assert proc.returncode == 2 and "objective.reward_fn" in proc.stderr and "Traceback" not in proc.stderr


def test_reward_model_scores_each_response_at_its_last_token(tmp_path):
    """GRPO scored by a `reward` run: the rollout's mean reward equals the reward model run on each sequence
    alone (unpadded prompt + response, score at its last token) — the left padding and the last-token index."""
    from meshlm.checkpoint.load import rebuild_on_device, source_config

    reward_cfg = load_config(ROOT / "configs" / "reward.toml", ["training.steps=2", "training.eval_interval=0",
                                                                  "checkpoint.interval=2", "metrics.tensorboard=false",
                                                                  "metrics.progress=plain"])
    _trainer(reward_cfg, tmp_path / "rm").train()
    cfg = _cfg("grpo", "training.steps=1", "objective.reward_fn=", f'objective.reward_model="{tmp_path / "rm"}"')
    objective = _trainer(cfg, tmp_path / "grpo").objective
    batch = objective.next_batch(None)
    reward = {k: float(s / c) for k, (s, c) in objective.metrics().items()}["reward"]
    path, rm_cfg = source_config(tmp_path / "rm")
    scorer = rebuild_on_device(path, rm_cfg, "cpu")
    buffer = objective.buffer  # the whole rollout (the minibatch is a shuffled half of it)
    P = buffer["input_ids"].shape[1] - buffer["response_mask"].shape[1]
    scores = []
    with torch.no_grad():
        for ids, real in zip(buffer["input_ids"], buffer["padding_mask"]):
            alone = ids[real][None]  # (1, n) the row's real tokens only
            scores.append(float(scorer(alone)[0, -1, 0]))
    assert batch["input_ids"].shape[1] > P
    assert abs(reward - sum(scores) / len(scores)) < 1e-5


def test_ppo_refuses_lora():
    """LoRA would freeze the value head with the rest of the base: refused, naming the keys."""
    with pytest.raises(ConfigError, match="lora.rank = 0"):
        _cfg("ppo", "lora.rank=4", 'checkpoint.init_from="somewhere"')
