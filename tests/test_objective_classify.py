"""The classify objective: labelled rows, a class head at the last real token, cross-entropy through the Trainer."""

from __future__ import annotations

import json
import math

import pytest
import torch

from meshlm.config.loader import config_to_toml, load_config
from meshlm.data.posttrain.labelled import encode_labelled
from meshlm.data.posttrain.rows import read_rows
from meshlm.errors import ConfigError, DataError
from meshlm.objectives import build_objective
from meshlm.objectives.classify import last_token_logits
from meshlm.train.run_dir import init_run_dir
from meshlm.train.trainer import Trainer

CLASSES = ["cat", "dog", "fish"]  # nothing safety-specific: the classes come from the config
SOUNDS = {"cat": "It says meow and purrs.", "dog": "It barks at the door.", "fish": "It swims in the bowl."}


def toy_rows() -> list[dict]:
    rows = []
    for i, name in enumerate(["Tom", "Rex", "Bob", "Ann", "Max", "Sue", "Kim", "Lee"]):
        for label, sound in SOUNDS.items():
            rows.append({"prompt": f"What is {name}'s pet number {i}?", "response": sound, "label": label})
    rows.append({"prompt": "Which pet purrs?", "label": "cat"})  # a prompt alone is an input too
    return rows


def _trainer(tmp_path, steps: int, *extra: str) -> Trainer:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in toy_rows()))
    cfg = load_config(None, [f'data.path="{data}"', "data.seq_len=32", "training.objective=classify",
                             f"objective.classes={json.dumps(CLASSES)}", "objective.prompt_tokens=8",
                             "model.dim=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1",
                             "model.ffn_hidden_dim=64", "training.batch_size=12", f"training.steps={steps}",
                             "training.eval_interval=0", "training.device=cpu", "checkpoint.enabled=false",
                             "metrics.interval=1", "metrics.tensorboard=false", "metrics.progress=plain",
                             "schedule.warmup_steps=5", *extra])
    init_run_dir(tmp_path / "run", config_to_toml(cfg), resume=False)
    return Trainer(cfg, tmp_path / "run")


def test_the_first_loss_is_the_cross_entropy_at_the_last_real_token(debug_dataset, tmp_path):
    trainer = _trainer(tmp_path, 1)
    batch = trainer.train_loader.next_batch()
    trainer.train_loader.reset()  # train_step takes the same batch
    assert batch["class_ids"].shape == (12,) and batch["input_ids"].shape[0] == 12
    with torch.no_grad():
        logits = trainer.model(batch["input_ids"])  # (B, T, C)
        losses = []
        for row in range(12):  # by hand: the logits at position length - 1, -log softmax of the true class
            last = logits[row, int(batch["lengths"][row]) - 1]  # (C,)
            losses.append(torch.logsumexp(last, 0) - last[int(batch["class_ids"][row])])
        by_hand = torch.stack(losses).mean()
    record = trainer.train_step()
    # the same fp32 ops in another order (cross_entropy's fused log-softmax): ~1e-7 relative
    assert float(record["loss"]) == pytest.approx(float(by_hand), rel=1e-5)
    assert logits.shape[-1] == len(CLASSES)
    assert float(by_hand) == pytest.approx(math.log(3), rel=0.2)  # a fresh head (std 0.02): nearly uniform


def test_a_toy_labelled_set_trains_to_high_accuracy(debug_dataset, tmp_path):
    trainer = _trainer(tmp_path, 40, "optimizer.lr=5e-3")
    trainer.train()
    rows = read_rows(tmp_path / "rows.jsonl", objective="classify")
    encoded, stats = encode_labelled(rows, trainer.hooks.data.tokenizer, CLASSES, 32, 8)
    assert stats.examples == len(rows) == 25 and rows[-1].completion is None
    trainer.model.eval()
    correct = 0
    with torch.no_grad():
        for ids, cls in encoded:
            logits = last_token_logits(trainer.model, torch.tensor([ids]), torch.tensor([len(ids)]))
            correct += int(logits.argmax(-1)) == cls
    assert correct / len(encoded) >= 0.9
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["accuracy"] >= 0.9 and last["loss"] < 0.5  # the objective's metric, logged by the trainer


def test_labelled_rows_and_classes_are_checked(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "response": "r", "label": "cat"}\n{"prompt": "p", "response": "r", '
                   '"label": "bird"}\n')
    rows = read_rows(bad, data_kind="labelled")
    assert [r.kind for r in rows] == ["labelled", "labelled"] and rows[0].label == "cat"
    with pytest.raises(DataError, match=r"bad.jsonl:2: label 'bird' is not one of the classes cat, dog, fish"):
        encode_labelled(rows, None, CLASSES, 32, 8)
    bad.write_text('{"prompt": "p", "response": 3, "label": "cat"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: field 'response' of a labelled row must be a string"):
        read_rows(bad)
    with pytest.raises(ConfigError, match="needs objective.classes"):
        build_objective("classify")
