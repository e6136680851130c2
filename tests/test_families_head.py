"""What a head is belongs to the checkpoint (``model.head``): a run writes it into its config, and loading and
export read it — a classifier's class head is refused by generate, to-hf and to-gguf by what it is, not by its
objective's name."""

from __future__ import annotations

import pytest
import torch

from meshlm.checkpoint.load import model_from_checkpoint
from meshlm.checkpoint.manager import CheckpointManager
from meshlm.config.loader import config_to_toml, load_config
from meshlm.errors import CheckpointError
from meshlm.interop import convert_to_hf
from meshlm.interop.gguf_export import convert_to_gguf
from meshlm.models.build import adapt_meta_model, meta_model
from meshlm.models.init import materialize
from meshlm.objectives import build_objective
from tiny_hf import chatml_tokenizer

TINY = ["model.dim=16", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1", "model.ffn_hidden_dim=32",
        "model.vocab_size=320", "model.max_seq_len=16", "data.seq_len=16"]


@pytest.mark.parametrize("objective, head", [("pretrain", "lm"), ("reward", "score"), ("classify", "classes"),
                                             ("ppo", "lm_value")])
def test_a_run_writes_its_head_into_the_config(objective, head):
    cfg = load_config(None, TINY + [f'training.objective="{objective}"', 'objective.classes=["a", "b", "c"]'])
    assert cfg.model.head == ""
    model = meta_model(cfg.model)
    adapt_meta_model(model, build_objective(cfg.training.objective, cfg.objective), cfg.lora)
    assert cfg.model.head == model.cfg.head == head
    assert f'head = "{head}"' in config_to_toml(cfg)  # what the trainer writes into each checkpoint


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A tiny classify checkpoint (3 classes) with a tokenizer, written as a run writes one."""
    root = tmp_path_factory.mktemp("classify")
    cfg = load_config(None, TINY + ['training.objective="classify"', 'objective.classes=["a", "b", "c"]'])
    model = meta_model(cfg.model)
    adapt_meta_model(model, build_objective(cfg.training.objective, cfg.objective), cfg.lora)
    materialize(model, "cpu", 0)
    chatml_tokenizer(320).save(str(root / "tokenizer.json"))
    CheckpointManager(root / "run", keep_last=1).save(1, [model], None, {}, config_to_toml(cfg),
                                                      extra_files={"tokenizer.json": root / "tokenizer.json"})
    return root / "run"


def test_a_class_head_is_read_from_the_checkpoint_and_refused_where_it_cannot_go(classifier, tmp_path):
    model, cfg, _, _ = model_from_checkpoint(classifier)
    assert cfg.model.head == model.cfg.head == "classes" and model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 3)
    with pytest.raises(CheckpointError, match="a classifier's class head .* cannot generate"):
        model_from_checkpoint(classifier, generates=True)
    with pytest.raises(CheckpointError, match="has a classes head"):
        convert_to_hf(classifier, tmp_path / "hf")
    with pytest.raises(CheckpointError, match="has a classes head, not a language-model head"):
        convert_to_gguf(classifier, tmp_path / "model.gguf")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "model.gguf").exists()
