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
    # tokens_per_s counts the loss's targets (inputs); positions_per_s every position of the padded batches
    assert last["positions_per_s"] > 5 * last["tokens_per_s"] > 0


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


class _PairTokens:
    """A word-level pair tokenizer (what PairLoader asks of a tokenizer): ids, mask and token types."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {"[pad]": 0}

    def batch(self, firsts, seconds, max_len):
        encoded = []
        for first, second in zip(firsts, seconds):
            words = [(w, 0) for w in first.split()] + [(w, 1) for w in second.split()]
            encoded.append([(self.vocab.setdefault(w, len(self.vocab)), t) for w, t in words][:max_len])
        width = max(len(e) for e in encoded)
        out = {k: torch.zeros(len(encoded), width, dtype=torch.long) for k in ("ids", "mask", "type_ids")}
        for row, e in enumerate(encoded):
            out["ids"][row, :len(e)] = torch.tensor([i for i, _ in e])
            out["type_ids"][row, :len(e)] = torch.tensor([t for _, t in e])
            out["mask"][row, :len(e)] = 1
        return out


class _BagOfWords(torch.nn.Module):
    """A pair classifier that is no decoder: mean of word vectors over real tokens, then the head ``output``."""

    def __init__(self) -> None:
        super().__init__()
        self.words, self.output = torch.nn.Embedding(256, 16), torch.nn.Linear(16, len(CLASSES))

    def forward(self, ids, mask, type_ids):
        vectors = self.words(ids) * (mask * type_ids).unsqueeze(-1)  # the response's words
        return self.output(vectors.sum(1) / (mask * type_ids).sum(1, keepdim=True).clamp(min=1))


def _given(tmp_path, *extra: str):
    from meshlm.data.posttrain.labelled import PairLoader
    from meshlm.train.data_setup import PostTrainData

    tokens = _PairTokens()
    pairs = [(r["prompt"], r["response"], CLASSES.index(r["label"])) for r in toy_rows() if "response" in r]
    data = PostTrainData(tokenizer=tokens, tokenizer_dir=tmp_path, eval_loader=None,
                         train_loader=PairLoader(pairs, tokens, 32, 8, seed=0))
    cfg = load_config(None, ["training.objective=classify", f"objective.classes={json.dumps(CLASSES)}",
                             "training.batch_size=8", "training.steps=30", "training.eval_interval=0",
                             "training.device=cpu", "checkpoint.enabled=false", "metrics.interval=1",
                             "metrics.tensorboard=false", "metrics.progress=plain", "optimizer.lr=1e-2",
                             "schedule.name=constant", "schedule.warmup_steps=0", *extra])
    init_run_dir(tmp_path / "run", config_to_toml(cfg), resume=False)
    torch.manual_seed(0)
    model = _BagOfWords().eval()  # handed over in eval mode, as the encoder judge's classifier holds it
    return Trainer(cfg, tmp_path / "run", model=model, data=data), model, pairs, tokens


def test_a_given_model_trains_on_its_own_pair_batches(tmp_path):
    """A model that is no [model] decoder (the encoder judge's case) trains through the one Trainer on batches of
    tokenized pairs; its head, a new module of the objective, runs at optimizer.new_modules_lr."""
    trainer, model, pairs, tokens = _given(tmp_path, "optimizer.new_modules_lr=5e-2")
    assert trainer.model is model and "given _BagOfWords" in trainer.describe()
    assert model.training  # trains in training mode (dropout on) whatever mode it came in
    head = {id(p) for p in model.output.parameters()}
    scales = {id(p): g.get("lr_scale", 1.0) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    assert {scales[i] for i in head} == {5.0} and {s for i, s in scales.items() if i not in head} == {1.0}
    batch = trainer.train_loader.next_batch()
    trainer.train_loader.reset()
    assert set(batch) == {"input_ids", "mask", "type_ids", "class_ids"} and batch["input_ids"].shape[0] == 8
    with torch.no_grad():
        by_hand = torch.nn.functional.cross_entropy(model(batch["input_ids"], batch["mask"], batch["type_ids"]),
                                                    batch["class_ids"])
    first = trainer.train_step()
    assert float(first["loss"]) == pytest.approx(float(by_hand), rel=1e-5)
    assert [g["lr"] for g in trainer.optimizers[0].param_groups] == [1e-2 * g.get("lr_scale", 1.0)
                                                                      for g in trainer.optimizers[0].param_groups]
    # only the head's groups carry a scale: without new_modules_lr the groups are as older checkpoints hold them
    assert sum("lr_scale" in g for g in trainer.optimizers[0].param_groups) == 2
    trainer.train()
    enc = tokens.batch([p for p, _, _ in pairs], [r for _, r, _ in pairs], 32)
    with torch.no_grad():
        predicted = model(enc["ids"], enc["mask"], enc["type_ids"]).argmax(-1)
    assert predicted.tolist() == [c for _, _, c in pairs]  # three sounds: learned exactly


def test_a_given_model_refuses_what_it_cannot_have(tmp_path):
    with pytest.raises(ConfigError, match="remove lora keys, checkpoint.init_from"):
        _given(tmp_path, "lora.rank=4", f'checkpoint.init_from="{tmp_path}"')
    with pytest.raises(ConfigError, match="optimizer.new_modules_lr must be >= 0"):
        load_config(None, ["optimizer.new_modules_lr=-1"])
