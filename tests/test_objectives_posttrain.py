"""Post-training objectives through `meshlm train` on the embedded default (debug flavour, synthetic JSONL sets):
SFT lowers the held-out assistant loss, the reward model separates held-out pairs, DPO raises the margin and
held-out preference accuracy, precomputed reference log-probs train like the frozen reference model, runs
resume bitwise, and bad data exits 2 naming file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import meshlm, meshlm_in_process, once_per_session
from tests.parity_batch import Case, run_cases

TINY = ["model.flavor=debug", "data.seq_len=64", "training.batch_size=8", "schedule.warmup_steps=2",
        "metrics.progress=plain", "metrics.tensorboard=false", "metrics.comm_sample_interval=0"]


def _sets(*overrides: str) -> list[str]:
    return [a for o in [*TINY, *overrides] for a in ("--set", o)]


def _train(run_dir: Path, *overrides: str, check: bool = True, extra: tuple[str, ...] = ()):
    return meshlm("train", *_sets(*overrides), "--run-dir", str(run_dir), *extra, check=check)


def _refused(run_dir: Path, *overrides: str):
    """`meshlm train` that must refuse before training: in this process (tests/helpers.py meshlm_in_process)."""
    return meshlm_in_process("train", *_sets(*overrides), "--run-dir", str(run_dir))


@pytest.fixture(scope="module")
def base_run(posttrain_base_run) -> Path:
    """A short pretraining run of the debug flavour (TINY, 4 steps): the base model of init_from / LoRA tests
    (conftest's, shared with tests/test_lora_train.py)."""
    return posttrain_base_run


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sft_lowers_held_out_assistant_loss(tmp_path):
    run = tmp_path / "sft"
    _train(run, "training.objective=sft", "training.steps=40", "training.eval_interval=20", "metrics.interval=1",
           "checkpoint.enabled=false")
    records = _records(run)
    first_loss = records[0]["loss"]  # assistant tokens of the first batch, before any update
    final_eval = records[-1]["eval_loss"]
    assert final_eval < 0.75 * first_loss, (first_loss, final_eval)


def test_reward_model_separates_held_out_pairs(tmp_path):
    run = tmp_path / "reward"
    _train(run, "training.objective=reward", "training.steps=30", "training.eval_interval=30",
           "metrics.interval=10", "checkpoint.interval=0")
    final = _records(run)[-1]
    assert final["eval_accuracy"] >= 0.9, final
    assert final["eval_margin"] > 0, final
    proc = meshlm_in_process("generate", "--checkpoint", str(run), "--prompt", "hi")  # a score head
    assert proc.returncode == 2 and "reward model" in proc.stderr, proc.stderr
    _check_sequence_classifier_export(run, tmp_path / "hf")


def _check_sequence_classifier_export(run: Path, out: Path) -> None:
    """`convert to-hf` writes the reward model as a one-label ...ForSequenceClassification whose scores on a
    right-padded batch equal meshlm's last-real-token scores."""
    import torch

    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.objectives.reward import sequence_scores
    from meshlm.tokenizer import MeshTokenizer

    transformers = pytest.importorskip("transformers")
    meshlm("convert", "to-hf", str(run), str(out))
    model, _, _, ckpt = model_from_checkpoint(run)
    tok = MeshTokenizer.load(ckpt / "tokenizer.json")
    rows = [tok.encode(text) + [tok.eos_id] for text in ("say something about apple kind warm", "say rude")]
    ids = torch.full((2, max(map(len, rows))), tok.pad_id)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        ours = sequence_scores(model, {"input_ids": ids, "lengths": torch.tensor([len(r) for r in rows])})
        torch.testing.assert_close(hf(input_ids=ids).logits.squeeze(-1), ours, rtol=1e-4, atol=1e-4)


def test_dpo_raises_margin_and_held_out_accuracy(tmp_path):
    run = tmp_path / "dpo"
    _train(run, "training.objective=dpo", "training.steps=30", "training.eval_interval=30", "metrics.interval=1",
           "optimizer.lr=1e-3", "checkpoint.enabled=false")
    records = _records(run)
    # Step 1's forward runs the starting policy, equal to its reference: every implicit reward is exactly 0.
    assert records[0]["rewards/margins"] == 0.0 and records[0]["rewards/accuracies"] == 0.0
    assert records[-1]["rewards/margins"] > 1.0
    assert records[-1]["eval_rewards/accuracies"] >= 0.9 and records[-1]["eval_rewards/margins"] > 1.0


def test_precomputed_reference_trains_like_the_reference_model(tmp_path):
    common = ("training.objective=dpo", "training.steps=4", "training.eval_interval=0", "metrics.interval=1",
              "checkpoint.enabled=false")
    _train(tmp_path / "model", *common, "objective.reference=model")
    _train(tmp_path / "pre", *common, "objective.reference=precomputed")
    for a, b in zip(_records(tmp_path / "model"), _records(tmp_path / "pre"), strict=True):
        # the reference forwards run on batches of another composition: equal up to fp32 rounding
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
        assert a["rewards/margins"] == pytest.approx(b["rewards/margins"], rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("objective", [["training.objective=sft"], ["training.objective=dpo"],
                                       ["training.objective=dpo", "objective.loss_type=kto"]],
                         ids=["sft", "dpo", "kto"])
def test_resume_is_bitwise(tmp_path, objective):
    common = (*objective, "training.steps=6", "training.eval_interval=0", "metrics.interval=1",
              "checkpoint.interval=3")
    _train(tmp_path / "straight", *common)
    _train(tmp_path / "resumed", *common, extra=("--stop-at", "3"))
    _train(tmp_path / "resumed", *common, extra=("--resume", "auto"))
    straight = {r["step"]: r for r in _records(tmp_path / "straight")}
    resumed = {r["step"]: r for r in _records(tmp_path / "resumed")}
    for step in (4, 5, 6):
        assert resumed[step]["loss"] == straight[step]["loss"], step
        assert resumed[step]["grad_norm"] == straight[step]["grad_norm"], step
    sha = [_weights_sha256(tmp_path / run) for run in ("straight", "resumed")]
    assert sha[0] == sha[1]


def _weights_sha256(run: Path) -> str:
    """What `meshlm inspect RUN --json` reports as weights_sha256 (the same two calls, in this process)."""
    from meshlm.checkpoint.load import model_from_checkpoint, weights_sha256

    return weights_sha256(model_from_checkpoint(run)[0])


def test_wrong_row_kind_exits_2_naming_file_and_line(tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}]}) + "\n" +
                    json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n")
    proc = _refused(tmp_path / "bad", "training.objective=sft", f"data.path={data}", "training.steps=1")
    assert proc.returncode == 2, proc.stderr
    assert f"{data}:2" in proc.stderr and "Traceback" not in proc.stderr


def test_tokenizer_larger_than_model_exits_2(tmp_path, base_run):
    # init_from's tokenizer has 2048 tokens; a model with 1024 embedding rows cannot read it. The shape comes from
    # the checkpoint, so asking for 1024 rows is refused as a contradiction naming both values, before any data
    # is read.
    proc = _refused(tmp_path / "bad", "training.objective=sft", f"checkpoint.init_from={base_run}",
                    "model.vocab_size=1024", "training.steps=1")
    assert proc.returncode == 2, proc.stderr
    assert "model.vocab_size = 1024 contradicts checkpoint.init_from" in proc.stderr, proc.stderr
    assert "2048" in proc.stderr and "Traceback" not in proc.stderr


_DDP2, _FSDP2, _TP2 = (["parallel.dp_replicate=2", "parallel.dp_shard=1"], ["parallel.dp_shard=2"],
                       ["parallel.tp=2", "parallel.dp_shard=1"])


PARITY = {
    **{f"{objective}-{name}": (objective, layout) for objective in ("sft", "dpo")
       for name, layout in (("ddp2", _DDP2), ("fsdp2", _FSDP2), ("tp2", _TP2))},
    "reward-ddp2": ("reward", _DDP2), "reward-fsdp2": ("reward", _FSDP2),  # the score head refuses tp > 1
    "kto-fsdp2": ("dpo", [*_FSDP2, "objective.loss_type=kto"]),  # KTO's reference point is summed over the dp group
}


@pytest.fixture(scope="module")
def parity_reports(tmp_path_factory) -> dict[str, dict]:
    """`meshlm diagnose parity --set TINY... --set training.objective=O --set LAYOUT... --nproc 2 --steps 3 --json`
    of every case, in one launch (tests/parity_batch.py), once per session."""
    cases = {name: Case(2, [*TINY, f"training.objective={objective}", *layout], 3)
             for name, (objective, layout) in PARITY.items()}
    return once_per_session(tmp_path_factory, "posttrain-parity", lambda work: run_cases(cases, work))


@pytest.mark.parametrize("name", list(PARITY))
def test_parity_with_single_device(name, parity_reports):
    report = parity_reports[name]
    assert report["ok"], report
    assert len(report["steps"]) == 3


def test_lora_without_base_is_a_config_error(tmp_path):
    proc = _refused(tmp_path / "bad", "training.objective=sft", "lora.rank=4", "training.steps=1")
    assert proc.returncode == 2 and "checkpoint.init_from" in proc.stderr, proc.stderr


def test_pair_major_micro_batches_keep_each_pair_whole():
    import torch

    from meshlm.data.posttrain import PreferenceLoader, RowEncoder, encode_pairs, parse_row
    from meshlm.objectives.base import pairs_to_rows
    from meshlm.tokenizer import MeshTokenizer
    from meshlm.train.data_setup import PairMajor

    tok = MeshTokenizer.train(["kind words and rude words", "say something about apples"], 300)
    rows = [parse_row({"prompt": f"say {i}", "chosen": " kind" * (i + 1), "rejected": " rude"}, f"x:{i}")
            for i in range(4)]
    pairs, _ = encode_pairs(rows, RowEncoder(tok), 32)
    flat = PreferenceLoader(pairs, 32, 4, pad_id=0, shuffle=False).next_batch()  # (8, T): 4 chosen, 4 rejected
    major = PairMajor(PreferenceLoader(pairs, 32, 4, pad_id=0, shuffle=False), offset=10).next_batch()
    longest = max(len(e.ids) for p in pairs for e in (p.chosen, p.rejected))
    assert major["input_ids"].shape == (4, 2, longest)  # padded to the batch's longest sequence
    assert torch.equal(pairs_to_rows(major)["input_ids"], flat["input_ids"])
    micro = pairs_to_rows({k: v[2:4] for k, v in major.items()})  # the trainer's slice of micro-batch 2 of 2
    assert torch.equal(micro["input_ids"], flat["input_ids"][[2, 3, 6, 7]])  # chosen 2, 3 then their rejected
    assert micro["index"].tolist() == [12, 13, 12, 13]  # pair numbers, shifted by the offset
