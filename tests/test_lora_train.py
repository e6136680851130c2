"""LoRA through `meshlm train` (lora.rank > 0 on an init_from base): only the adapters train and are saved, the
base stays bitwise unchanged, and `convert to-hf --adapter-only` gives a PEFT adapter that peft loads onto the
exported base with meshlm's merged logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from meshlm.checkpoint.load import model_from_checkpoint, resolve_checkpoint
from meshlm.config.loader import config_to_toml, load_config
from meshlm.models.lora import expected_lora_params, lora_modules, merge_lora, num_trainable_params
from tests.helpers import meshlm, meshlm_in_process, once_per_session

TINY = ["model.flavor=debug", "data.seq_len=64", "training.batch_size=8", "schedule.warmup_steps=2",
        "metrics.progress=plain", "metrics.tensorboard=false", "metrics.comm_sample_interval=0",
        "training.eval_interval=0"]
TARGETS = ["q", "v", "down"]


def _sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def _lora(base: Path) -> list[str]:
    return [*TINY, "training.objective=sft", f"checkpoint.init_from={base}", "lora.rank=4", "lora.alpha=8",
            f"lora.targets={','.join(TARGETS)}", "optimizer.lr=1e-2"]


@pytest.fixture(scope="module")
def base_run(posttrain_base_run) -> Path:
    """`meshlm train` with TINY for 4 steps (metrics.interval=4): conftest's, shared with
    tests/test_objectives_posttrain.py. Read only."""
    return posttrain_base_run


@pytest.fixture(scope="module")
def lora_run(base_run, tmp_path_factory) -> Path:
    def train(folder: Path) -> dict:
        run = folder / "lora"
        meshlm("train", *_sets([*_lora(base_run), "training.steps=6", "metrics.interval=6"]), "--run-dir", str(run))
        return {"run": str(run)}

    return Path(once_per_session(tmp_path_factory, "lora-run", train)["run"])  # one for both xdist workers


def test_base_unchanged_and_only_adapters_train(tmp_path, base_run):
    from meshlm.train.run_dir import init_run_dir
    from meshlm.train.trainer import Trainer

    cfg = load_config(None, [*_lora(base_run), "training.steps=4", "checkpoint.enabled=false"])
    init_run_dir(tmp_path / "run", config_to_toml(cfg), resume=False)
    trainer = Trainer(cfg, tmp_path / "run")
    assert num_trainable_params(trainer.model) == expected_lora_params(cfg.model, TARGETS, 4)
    trainer.train()
    base = model_from_checkpoint(base_run)[0].state_dict()
    for name, param in trainer.model.named_parameters():
        if not param.requires_grad:
            assert torch.equal(param.detach(), base[name]), name  # bitwise
    assert all(m.lora_B.abs().sum() > 0 for m in lora_modules(trainer.model).values())  # every adapter trained


def test_checkpoint_holds_adapters_and_names_its_base(lora_run, base_run):
    ckpt = resolve_checkpoint(lora_run)
    keys = FileSystemReader(str(ckpt / "dcp")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(k.endswith((".lora_A", ".lora_B")) for k in model_keys), model_keys[:5]
    assert len(model_keys) == 2 * len(TARGETS) * 4  # A and B per target per layer (debug: 4 layers)
    state = json.loads((ckpt / "train_state.json").read_text())
    assert Path(state["lora_base"]) == resolve_checkpoint(base_run)


def test_peft_adapter_on_exported_base_matches_merged_model(lora_run, base_run, tmp_path):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    meshlm("convert", "to-hf", str(base_run), str(tmp_path / "base_hf"))
    meshlm("convert", "to-hf", str(lora_run), str(tmp_path / "adapter"), "--adapter-only")
    model, cfg, _, _ = model_from_checkpoint(lora_run)
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        unmerged = model(tokens)
        merge_lora(model)
        merged = model(tokens)
        hf_base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base_hf", torch_dtype=torch.float32)
        base_logits = hf_base(tokens).logits
        hf = peft.PeftModel.from_pretrained(hf_base, tmp_path / "adapter").eval()
        peft_logits = hf(tokens).logits
    assert (merged - base_logits).abs().max() > 1e-3  # the adapters changed the model
    torch.testing.assert_close(merged, unmerged, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(peft_logits, merged, rtol=1e-4, atol=1e-4)  # fp32, two implementations


def test_merged_export_equals_merged_model(lora_run, tmp_path):
    transformers = pytest.importorskip("transformers")
    meshlm("convert", "to-hf", str(lora_run), str(tmp_path / "merged"))
    model, cfg, _, _ = model_from_checkpoint(lora_run)
    merge_lora(model)
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", torch_dtype=torch.float32)
        torch.testing.assert_close(hf(tokens).logits, model(tokens), rtol=1e-4, atol=1e-4)


def test_lora_resume_is_bitwise(base_run, tmp_path):
    common = _sets([*_lora(base_run), "training.steps=4", "checkpoint.interval=2", "metrics.interval=1"])
    meshlm("train", *common, "--run-dir", str(tmp_path / "straight"))
    meshlm("train", *common, "--run-dir", str(tmp_path / "resumed"), "--stop-at", "2")
    meshlm("train", *common, "--run-dir", str(tmp_path / "resumed"), "--resume", "auto")
    records = [{r["step"]: r for r in map(json.loads, (tmp_path / run / "metrics.jsonl").read_text().splitlines())}
               for run in ("straight", "resumed")]
    for step in (3, 4):  # after the resume: the adapters, their optimizer state and the base all restored
        assert records[1][step]["loss"] == records[0][step]["loss"], step
        assert records[1][step]["grad_norm"] == records[0][step]["grad_norm"], step


def test_lora_under_tensor_parallelism_equals_a_single_device(base_run, tmp_path):
    """Adapters laid out to follow their projection's sharding (column-parallel q/v: A whole, B by rows;
    row-parallel o/down: A by columns, B whole): tp2 gives the single-device loss and grad norm. Sequence
    parallelism stays refused (torch re-creates the sequence-parallel norm weights as trainable parameters)."""
    overrides = [*_lora(base_run), "lora.targets=q,v,o,down", "parallel.tp=2", "parallel.dp_shard=1",
                 "parallel.sequence_parallel=false"]
    proc = meshlm("diagnose", "parity", *_sets(overrides), "--nproc", "2", "--steps", "3", "--json", check=False)
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert proc.returncode == 0 and report["ok"], report
    refused = meshlm_in_process("train", *_sets([*overrides[:-1], "training.steps=1"]), "--run-dir",
                                str(tmp_path / "x"))
    assert refused.returncode == 2 and "parallel.sequence_parallel = false" in refused.stderr, refused.stderr
