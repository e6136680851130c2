"""End to end through the CLI (subprocesses, as a user runs it): prepare -> train -> resume -> generate ->
inspect, and the one-line, exit-code-2 answers to bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import meshlm

COMMON = ["--set", "data.seq_len=32", "--set", "training.batch_size=8", "--set", "metrics.tensorboard=false",
          "--set", "training.eval_interval=10", "--set", "checkpoint.interval=10", "--set", "metrics.interval=5"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from meshlm.data import embedded_documents

    root = tmp_path_factory.mktemp("corpus")
    docs = embedded_documents()[:600]
    (root / "texts").mkdir()
    for i, doc in enumerate(docs[:300]):
        (root / "texts" / f"doc{i:03d}.txt").write_text(doc, encoding="utf-8")
    with (root / "more.jsonl").open("w", encoding="utf-8") as f:
        for doc in docs[300:]:
            f.write(json.dumps({"text": doc}) + "\n")
    return root


def test_prepare_train_resume_generate_inspect(corpus, tmp_path):
    data = tmp_path / "data"
    out = meshlm("prepare", str(corpus / "texts"), str(corpus / "more.jsonl"), "--out", str(data),
                 "--vocab-size", "1024", "--val-fraction", "0.05")
    assert "prepared" in out.stdout
    assert json.loads((data / "manifest.json").read_text())["splits"]["train"]["documents"] > 500

    run = tmp_path / "run"
    cfg = ["configs/debug.toml", "--set", f'data.path="{data}"', "--set", "model.vocab_size=1024", *COMMON]
    meshlm("train", *cfg, "--run-dir", str(run), "--set", "training.steps=30", "--stop-at", "20")
    meshlm("train", *cfg, "--run-dir", str(run), "--set", "training.steps=30", "--resume", "auto")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records]
    assert steps == sorted(set(steps)) and steps[-1] == 30  # no duplicated steps across the resume
    assert records[-1]["loss"] < records[0]["loss"] - 0.5
    assert (run / "plots" / "loss.png").stat().st_size > 1000
    assert (run / "config.resolved.toml").is_file()

    gen = meshlm("generate", "--checkpoint", str(run), "--prompt-ids", "1,2,3", "--max-new-tokens", "16",
                 "--greedy", "--json")
    sample = json.loads(gen.stdout)
    assert sample["ids"][:3] == [1, 2, 3] and len(sample["ids"]) <= 19 and isinstance(sample["text"], str)
    again = json.loads(meshlm("generate", "--checkpoint", str(run), "--prompt-ids", "1,2,3", "--max-new-tokens",
                              "16", "--greedy", "--json").stdout)
    assert again["ids"] == sample["ids"]  # greedy is deterministic

    info = json.loads(meshlm("inspect", str(run), "--json").stdout)
    assert info["step"] == 30 and info["num_params"] == 459328 - (2048 - 1024) * 64 * 2
    assert len(info["weights_sha256"]) == 64 and info["config"]["model"]["vocab_size"] == 1024


def test_resume_falls_back_past_a_corrupted_checkpoint(debug_dataset, tmp_path):
    run = tmp_path / "run"
    cfg = ["configs/debug.toml", "--set", "training.steps=20", *COMMON]
    meshlm("train", *cfg, "--run-dir", str(run))
    shard = next((run / "checkpoints" / "step-00000020" / "dcp").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated
    out = meshlm("train", *cfg, "--run-dir", str(run), "--resume", "auto")
    assert "step-00000020 is not usable" in out.stdout and "falling back" in out.stdout
    assert "resumed from" in out.stdout and "step-00000010" in out.stdout
    info = json.loads(meshlm("inspect", str(run), "--json").stdout)
    assert info["step"] == 20  # retrained 10 -> 20 and saved a valid step-20 again


@pytest.mark.parametrize("args, message", [
    (["train", "configs/debug.toml", "--set", "training.stepz=3"], "did you mean 'training.steps'"),
    (["train", "missing.toml"], "config file 'missing.toml' does not exist"),
    (["train", "configs/debug.toml", "--set", "data.seq_len=1000"], "larger than the model's context"),
    (["train", "configs/debug.toml", "--set", 'data.path="/nonexistent/data"'], "/nonexistent/data"),
    (["prepare", "/nonexistent/corpus.txt", "--out", "OUT"], "/nonexistent/corpus.txt"),
    (["generate", "--checkpoint", "/nonexistent/run", "--prompt", "x"], "does not exist"),
    (["inspect", "/nonexistent/run"], "does not exist"),
    (["generate", "--checkpoint", "/", "--prompt-ids", "1,x"], "no valid checkpoint"),
])
def test_bad_input_is_one_line_exit_2(args, message, tmp_path):
    args = [a.replace("OUT", str(tmp_path / "out")) for a in args]
    proc = meshlm(*args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_run_dir_holding_a_run_is_refused(debug_dataset, tmp_path):
    run = tmp_path / "run"
    meshlm("train", "configs/debug.toml", "--set", "training.steps=2", *COMMON, "--run-dir", str(run))
    before = (run / "metrics.jsonl").read_text()
    proc = meshlm("train", "configs/debug.toml", "--set", "training.steps=2", *COMMON, "--run-dir", str(run),
                  check=False)
    assert proc.returncode == 2 and "already holds a run" in proc.stderr
    assert (run / "metrics.jsonl").read_text() == before  # nothing the user had is touched


def test_config_keys_and_show():
    keys = json.loads(meshlm("config", "keys", "--json").stdout)
    assert {"training.steps", "training.seed", "checkpoint.interval", "metrics.interval"} <= {k["key"] for k in keys}
    shown = meshlm("config", "show", "configs/debug.toml", "--set", "training.steps=7").stdout
    assert "[training]" in shown and "steps = 7" in shown


def test_every_json_command_prints_json_alone(debug_dataset, tmp_path):
    """`--json` means the JSON document alone on stdout, logs on stderr — for every command with the flag,
    including those whose ranks run in child processes (train --nproc, diagnose parity). The whole stdout is
    parsed; `generate` prints one JSON object per line (per sample)."""
    run, hf = tmp_path / "run", tmp_path / "hf"
    tiny = ["configs/debug.toml", "--set", "training.steps=2", *COMMON]

    def document(*args: str):
        out = meshlm(*args, "--json")
        return json.loads(out.stdout)

    summary = document("train", *tiny, "--nproc", "2", "--run-dir", str(run))
    assert summary["step"] == 2 and summary["run_dir"] == str(run)
    assert document("train", *tiny, "--run-dir", str(tmp_path / "single"))["step"] == 2
    assert document("inspect", str(run))["step"] == 2
    lines = meshlm("generate", "--checkpoint", str(run), "--prompt-ids", "1,2", "--max-new-tokens", "3",
                   "--num-samples", "2", "--json").stdout.splitlines()
    assert len(lines) == 2 and all(json.loads(line)["ids"][:2] == [1, 2] for line in lines)
    assert document("convert", "to-hf", str(run), str(hf))
    assert document("convert", "from-hf", str(hf), str(tmp_path / "back"))
    assert {"training", "model"} <= set(document("config", "show", *tiny))
    assert document("config", "keys")
    assert document("bench", "train", "--batch", "1", "--seq", "16", "--steps", "1", "--warmup", "0")["tokens_per_s"]
    assert document("plan", "--model", "debug", "--gpus", "2", "--gpu", "cpu", "--seq", "64",
                    "--global-batch-seqs", "8")["recommended"]["feasible"]
    assert {"predicted", "measured"} <= set(document("diagnose", "memory", *tiny, "--work-dir", str(tmp_path / "m")))
    assert document("diagnose", "parity", *tiny, "--nproc", "2", "--steps", "2")["steps"]
