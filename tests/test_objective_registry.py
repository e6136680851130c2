"""The objective interface: an objective outside meshlm is one module plus one registration line, and trains;
the built-in objectives come from the catalog and declare what they read."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest

from meshlm.config.catalog import OBJECTIVES, register_objective
from meshlm.config.loader import config_to_toml, load_config
from meshlm.config.posttrain import ObjectiveConfig
from meshlm.data.posttrain.rows import DATA_KINDS
from meshlm.errors import ConfigError
from meshlm.objectives import KTOObjective, PreferenceObjective, build_objective, objective_class
from meshlm.objectives.base import Objective
from meshlm.train.run_dir import init_run_dir
from meshlm.train.trainer import Trainer

# A plug-in: next-token cross-entropy times a constant, with a metric and state of its own.
TOY = '''
import torch
from meshlm.objectives.base import IGNORE_INDEX, Objective
from meshlm.objectives.pretrain import NextTokenObjective

class ScaledNextToken(Objective):
    name = "toy"
    config_keys = ()
    scale = 3.0

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.batches = 0

    def num_loss_tokens(self, batch):
        return (batch["labels"] != IGNORE_INDEX).sum()

    def loss_sum(self, model, batch):
        self.batches += 1
        return self.scale * NextTokenObjective.loss_from_logits(model(batch["input_ids"]), batch["labels"])

    def metrics(self):
        one = torch.ones((), dtype=torch.float64)
        return {"toy_batches": (self.batches * one, one)}

    def state_dict(self):
        return {"batches": self.batches}
'''

QUIET = ["data.seq_len=32", "training.batch_size=4", "training.steps=2", "training.eval_interval=0",
         "checkpoint.interval=2", "metrics.interval=1", "metrics.tensorboard=false", "metrics.progress=plain"]


@pytest.fixture
def toy_objective(tmp_path, monkeypatch):
    (tmp_path / "toy_objective.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    register_objective("toy", "toy_objective:ScaledNextToken")  # the one registration line
    yield
    del OBJECTIVES["toy"]


def _train(dataset, run_dir, objective):
    cfg = load_config(None, [f'data.path="{dataset}"', *QUIET, f"training.objective={objective}"])
    init_run_dir(run_dir, config_to_toml(cfg), resume=False)
    trainer = Trainer(cfg, run_dir)
    first = float(trainer.train_step()["loss"])
    trainer.train()
    return trainer, first


def test_a_registered_objective_trains_a_step(toy_objective, debug_dataset, tmp_path):
    toy, toy_loss = _train(debug_dataset, tmp_path / "toy", "toy")
    _, pretrain_loss = _train(debug_dataset, tmp_path / "pretrain", "pretrain")
    assert type(toy.objective).__name__ == "ScaledNextToken" and toy.step == 2
    # the same seed, data and weights: the first loss is 3x pretraining's; pretraining's head may fuse the loss
    # (other fp32 summation order and chunking: ~1e-6 relative), hence 1e-4
    assert toy_loss == pytest.approx(3.0 * pretrain_loss, rel=1e-4)
    record = json.loads((tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["toy_batches"] == 2  # its own metric, logged by the trainer
    state = json.loads((tmp_path / "toy" / "checkpoints" / "step-00000002" / "train_state.json").read_text())
    assert state["objective"] == {"batches": 2}  # its own state, checkpointed


def test_objective_names_come_from_the_catalog(toy_objective):
    assert load_config(None, ["training.objective=toy"]).training.objective == "toy"
    del OBJECTIVES["toy"]
    with pytest.raises(ConfigError, match="training.objective: 'toy' is not one of pretrain, sft"):
        load_config(None, ["training.objective=toy"])
    OBJECTIVES["toy"] = "toy_objective:ScaledNextToken"  # for the fixture's teardown
    with pytest.raises(ConfigError, match="'nope' is not one of"):
        objective_class("nope")


def test_builtin_objectives_declare_what_they_read():
    keys = {f.name for f in dataclasses.fields(ObjectiveConfig)}
    read: set[str] = set()
    for name in OBJECTIVES:
        cls = objective_class(name)
        assert issubclass(cls, Objective) and cls.name == name
        assert cls.data_kind == "tokens" or cls.data_kind in DATA_KINDS, name
        assert set(cls.config_keys) <= keys, name
        read |= set(cls.config_keys)
    read |= set(KTOObjective.config_keys)
    assert read == keys  # every [objective] key has a reader
    # pipeline support is declared by a loss of the last stage's logits: only next-token objectives
    assert [n for n in OBJECTIVES if objective_class(n).loss_from_logits is not None] == ["pretrain"]


def test_the_dpo_family_builds_its_kto_member():
    assert type(build_objective("dpo")) is PreferenceObjective
    kto = build_objective("dpo", ObjectiveConfig(loss_type="kto"))
    assert type(kto) is KTOObjective and kto.data_kind == "unpaired"


def test_base_hooks_are_no_ops():
    objective = Objective()
    assert objective.metrics() == {} and objective.state_dict() is None and objective.init_from_keep("x")
    assert objective.new_modules == () and objective.loss_from_logits is None
    with pytest.raises(NotImplementedError):
        objective.loss_sum(None, {})
