"""KTO (objective "dpo", loss_type "kto"; meshlm/objectives/kto.py): the loss against a hand computation, the
unpaired rows and their mismatched KL rows, a reference point that does not depend on the micro-batch size, and a
tiny training run that separates desirable from undesirable held-out completions."""

from __future__ import annotations

import json
import math

import pytest
import torch

from meshlm.config.loader import config_to_toml, load_config
from meshlm.data.posttrain import PreferenceLoader, RowEncoder, encode_unpaired, parse_row
from meshlm.errors import DataError
from meshlm.objectives.losses import kto_loss, kto_reference_point
from meshlm.tokenizer import MeshTokenizer
from meshlm.train.run_dir import init_run_dir
from meshlm.train.trainer import Trainer


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_kto_loss_equals_a_hand_computation():
    policy = torch.tensor([-10.0, -12.0, -7.5, -20.0])
    reference = torch.tensor([-11.0, -11.0, -8.0, -15.0])
    desirable = torch.tensor([True, False, True, False])
    policy_kl, ref_kl = torch.tensor([-30.0, -25.0, -28.0]), torch.tensor([-31.0, -24.5, -29.0])
    s, c = kto_reference_point(policy_kl, ref_kl)
    z0 = max(0.0, float(s / c))
    assert z0 == pytest.approx((1.0 - 0.5 + 1.0) / 3)  # mean log-ratio of the mismatched pairs
    beta, wd, wu = 0.2, 1.5, 0.7
    out = kto_loss(policy, reference, desirable, z0, beta=beta, desirable_weight=wd, undesirable_weight=wu)
    expected = []
    for p, r, good in zip(policy.tolist(), reference.tolist(), desirable.tolist()):
        ratio = p - r
        expected.append(wd * (1 - _sigmoid(beta * (ratio - z0))) if good else wu * (1 - _sigmoid(beta * (z0 - ratio))))
    assert out.losses.tolist() == pytest.approx(expected, rel=1e-6)
    assert out.rewards.tolist() == pytest.approx([beta * (p - r) for p, r in zip(policy.tolist(), reference.tolist())])
    # the reference point carries no gradient; the policy does, with the sign that favours desirable rows
    p = policy.clone().requires_grad_()
    kl = torch.tensor(z0, requires_grad=True)
    kto_loss(p, reference, desirable, kl).losses.sum().backward()
    assert kl.grad is None and (p.grad[desirable] < 0).all() and (p.grad[~desirable] > 0).all()


@pytest.fixture(scope="module")
def tok() -> MeshTokenizer:
    return MeshTokenizer.train(["say something kind or rude about apples and pears"] * 5, 300)


def test_unpaired_rows_and_their_kl_rows(tok):
    rows = [parse_row({"prompt": "say a", "completion": " kind", "label": True}, "f:1"),
            parse_row({"prompt": "say b", "completion": " rude", "label": False}, "f:2"),
            parse_row({"prompt": "say c", "chosen": " apples", "rejected": " pears"}, "f:3")]
    assert rows[0].kind == "unpaired" and rows[1].label is False and rows[2].kind == "preference"
    enc = RowEncoder(tok)
    items, stats = encode_unpaired(rows, enc, 64)
    assert [i.label for i in items] == [True, False, True, False]  # the preference row gives two items
    completions = [" kind", " rude", " apples", " pears"]
    prompts = ["say a", "say b", "say c", "say c"]
    for k, item in enumerate(items):
        assert item.chosen.ids == enc.prompt_completion(prompts[k], completions[k]).ids
        # KL row: the same prompt with the previous item's completion (item 0 takes the last's)
        assert item.rejected.ids == enc.prompt_completion(prompts[k], completions[k - 1]).ids
    assert stats.examples == 4
    batch = PreferenceLoader(items, 64, 4, pad_id=0, shuffle=False).next_batch()
    assert batch["desirable"].tolist() == [True, False, True, False] * 2
    for record, match in (({"prompt": "p", "completion": "c", "label": "yes"}, "true"),
                          ({"completion": "c", "label": True}, "prompt")):
        with pytest.raises(DataError, match=match):
            parse_row(record, "f:9")


def _cfg(tmp_path, *overrides: str):
    base = ["model.flavor=debug", "data.seq_len=64", "training.batch_size=8", "schedule.warmup_steps=2",
            "training.objective=dpo", "objective.loss_type=kto", "metrics.interval=1", "metrics.progress=plain",
            "metrics.tensorboard=false", "metrics.comm_sample_interval=0", "checkpoint.enabled=false"]
    return load_config(None, [*base, *overrides])


def _run(cfg, run_dir) -> list[dict]:
    init_run_dir(run_dir, config_to_toml(cfg), resume=False)
    Trainer(cfg, run_dir).train()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_reference_point_does_not_depend_on_the_micro_batch(tmp_path):
    """z₀ is computed once per global batch before the step: accumulating 4 micro-batches of 2 items gives the
    loss of one batch of 8 (TRL would average z₀ per micro-batch)."""
    whole = _run(_cfg(tmp_path, "training.steps=2", "training.eval_interval=0"), tmp_path / "whole")
    micro = _run(_cfg(tmp_path, "training.steps=2", "training.eval_interval=0", "training.micro_batch_size=2"),
                 tmp_path / "micro")
    assert whole[1]["kl"] > 0  # the policy has moved: a non-trivial reference point
    for a, b in zip(whole, micro, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["kl"] == pytest.approx(b["kl"], rel=1e-5)


def test_kto_separates_held_out_completions(tmp_path):
    records = _run(_cfg(tmp_path, "training.steps=12", "training.eval_interval=12"), tmp_path / "kto")
    first, last = records[0], records[-1]
    assert first["rewards/chosen"] == 0.0 and first["rewards/rejected"] == 0.0  # policy = reference at step 1
    assert last["eval_rewards/chosen"] > 0.5 > -0.5 > last["eval_rewards/rejected"], last
    assert last["eval_loss"] < 0.6 * first["loss"], (first["loss"], last["eval_loss"])
