"""``checkpoint.init_from`` and align's ``base.checkpoint`` take the model's shape, tokenizer and chat template
from the checkpoint (issue 19 §2): a config states only what it changes, a shape key that contradicts the
checkpoint is a one-line error naming both values; a tied head is stored once, and old checkpoints holding both
copies still load.

The converted model (tests/tiny_hf.py) has 384 embedding rows and dim 64 where meshlm's default flavour has 2048
and 64: the regression is configs/sft.toml + init_from stopping on "tokenizer has ... tokens but the model's
embedding has 2048 rows".
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

pytest.importorskip("transformers")

from meshlm.checkpoint.load import model_from_checkpoint, resolve_checkpoint, weights_sha256  # noqa: E402
from meshlm.checkpoint.manager import CheckpointManager  # noqa: E402
from meshlm.cli.main import main  # noqa: E402
from meshlm.config.loader import load_config  # noqa: E402
from meshlm.errors import ConfigError  # noqa: E402
from meshlm.interop import convert_from_hf  # noqa: E402
from tiny_hf import VOCAB_ROWS, chatml_tokenizer, write_chatml_llama  # noqa: E402

SFT = "configs/sft.toml"
QUICK = ["training.steps=1", "training.batch_size=2", "training.eval_interval=0", "metrics.interval=1",
         "metrics.tensorboard=false", "metrics.progress=plain", "checkpoint.interval=0"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("init-from")
    write_chatml_llama(root / "hf", chatml_tokenizer(), template_in="jinja")
    convert_from_hf(root / "hf", root / "run")
    return root / "run"


def stored_keys(ckpt) -> set[str]:
    return set(FileSystemReader(str(ckpt / "dcp")).read_metadata().state_dict_metadata)


def test_model_keys_the_config_leaves_out_come_from_the_checkpoint(converted):
    cfg = load_config(SFT, [f"checkpoint.init_from={converted}", "model.max_seq_len=64"], inherit=True)
    source = load_config(converted / "config.resolved.toml").model
    assert cfg.model.vocab_size == VOCAB_ROWS and cfg.model.tie_embeddings and cfg.model.source == "hf"
    assert cfg.model.flavor == "custom"  # sft.toml's flavor = "debug" only names a shape to train from scratch
    assert cfg.model.max_seq_len == 64  # not a shape key: the config may change it
    for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden_dim", "norm_eps", "rope_theta"):
        assert getattr(cfg.model, key) == getattr(source, key), key
    assert load_config(SFT, [f"checkpoint.init_from={converted}"]).model.vocab_size == 2048  # without inherit


@pytest.mark.parametrize("key, value, theirs", [("dim", 128, 64), ("vocab_size", 2048, VOCAB_ROWS),
                                                ("tie_embeddings", "false", True), ("head_dim", 32, 16)])
def test_a_shape_key_that_contradicts_the_checkpoint_names_both_values(key, value, theirs, converted):
    with pytest.raises(ConfigError) as err:
        load_config(SFT, [f"checkpoint.init_from={converted}", f"model.{key}={value}"], inherit=True)
    message = str(err.value)
    assert f"model.{key} = " in message and f"whose model has {key} = {theirs!r}" in message
    assert "\n" not in message


def test_missing_init_from_is_one_line_exit_2(tmp_path, capfd):
    with pytest.raises(SystemExit) as exc:
        main(["train", SFT, "--set", f"checkpoint.init_from={tmp_path / 'nope'}", "--run-dir", str(tmp_path / "r")])
    err = capfd.readouterr().err
    assert exc.value.code == 2 and "does not exist" in err and len(err.strip().splitlines()) == 1


def test_sft_toml_fine_tunes_a_converted_model_of_another_vocab(converted, tmp_path, capfd):
    """Regression: configs/sft.toml + --set checkpoint.init_from=RUN stopped on the 2048-row embedding."""
    run = tmp_path / "sft"
    sets = [a for item in [f"checkpoint.init_from={converted}", *QUICK] for a in ("--set", item)]
    with pytest.raises(SystemExit) as exc:
        main(["train", SFT, *sets, "--run-dir", str(run), "--json"])
    summary = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert exc.value.code == 0 and summary["step"] == 1 and summary["loss"] == summary["loss"]  # finite, not NaN
    ckpt = resolve_checkpoint(run)
    assert (ckpt / "chat_template.jinja").is_file() and (ckpt / "tokenizer_meta.json").is_file()  # travel along
    assert "model.output.weight" not in stored_keys(ckpt) and "model.tok_embeddings.weight" in stored_keys(ckpt)
    model, job, _, _ = model_from_checkpoint(run)
    assert job.model.vocab_size == VOCAB_ROWS and model.output.weight is model.tok_embeddings.weight


def test_align_base_checkpoint_takes_a_converted_model(converted, tmp_path):
    from meshlm.safety.align_config import load_align_config
    from meshlm.safety.pipeline import train_sft

    data = tmp_path / "data"
    data.mkdir()
    rows = [{"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": w}]}
            for w in ("yes", "no", "maybe", "later", "soon", "never")]
    (data / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_align_config(None, [f"base.checkpoint={converted}", "sft.steps=1", "sft.batch_size=2",
                                   "sft.warmup_steps=0", "model.seq_len=64"])
    run = train_sft(cfg, data / "sft.jsonl", converted, tmp_path / "sft", resume=False, log=print)
    _, job, state, _ = model_from_checkpoint(run)
    assert state["step"] == 1 and job.model.vocab_size == VOCAB_ROWS and job.model.source == "hf"
    wrong = load_align_config(None, [f"base.checkpoint={converted}", "sft.steps=1", "model.dim=32"])
    with pytest.raises(ConfigError, match="model.dim = 32 contradicts"):
        train_sft(wrong, data / "sft.jsonl", converted, tmp_path / "sft-wrong", resume=False, log=print)


def test_old_checkpoint_with_both_copies_of_a_tied_head_still_loads(converted, tmp_path):
    model, _, _, ckpt = model_from_checkpoint(converted)
    assert "model.output.weight" not in stored_keys(ckpt)  # stored once by the converter
    old = tmp_path / "old" / "checkpoints" / ckpt.name
    shutil.copytree(ckpt, old)
    shutil.rmtree(old / "dcp")
    both = {k: v.clone() for k, v in model.state_dict().items()}  # what meshlm wrote before: two copies
    assert "output.weight" in both
    dcp.save({"model": both}, checkpoint_id=str(old / "dcp"), no_dist=True)
    (old / "manifest.json").unlink()
    CheckpointManager(tmp_path / "old", keep_last=1)._write_manifest(old, 0, {})
    assert "model.output.weight" in stored_keys(old)
    again = model_from_checkpoint(old)[0]
    assert again.output.weight is again.tok_embeddings.weight
    assert weights_sha256(again) == weights_sha256(model)
    size = lambda folder: sum(f.stat().st_size for f in (folder / "dcp").iterdir())  # noqa: E731
    assert size(old) - size(ckpt) >= model.tok_embeddings.weight.numel() * 4  # the second copy, in fp32
