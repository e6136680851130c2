"""The one stop rule (issue 31 item 3): a checkpoint's stop ids are its eos ids and, for a chat, its chat template's
end-of-turn token — the same ids for ``meshlm generate``, the server, the safety generator and the RL objectives."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from meshlm.generate.stops import chat_template_or_none, stop_ids  # noqa: E402
from meshlm.interop import convert_from_hf  # noqa: E402
from meshlm.tokenizer import MeshTokenizer  # noqa: E402
from tiny_hf import chatml_tokenizer, write_chatml_llama  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return chatml_tokenizer()


def converted(tok, root, **kw):
    """(checkpoint folder, its MeshTokenizer) of a tiny converted ChatML model."""
    write_chatml_llama(root / "hf", tok, tied=False, **kw)
    convert_from_hf(root / "hf", root / "run")
    ckpt = sorted((root / "run" / "checkpoints").iterdir())[-1]
    return ckpt, MeshTokenizer.load(ckpt / "tokenizer.json")


def test_base_model_eos_plus_the_templates_end_of_turn(tok, tmp_path):
    """A base SmolLM2's eos is <|endoftext|>; its chat must also stop at <|im_end|>. The lookup by name the server,
    the safety generator and RL used ("<|end|>") found nothing here, so their chats ran to max_tokens."""
    ckpt, tokenizer = converted(tok, tmp_path, eos="<|endoftext|>")
    eos, end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    assert stop_ids(tokenizer, ckpt) == [eos, end]
    assert stop_ids(tokenizer, ckpt, chat=False) == [eos]
    assert "<|end|>" not in tokenizer.special_ids  # what the old lookup asked for


def test_instruct_model_lists_its_stop_once(tok, tmp_path):
    ckpt, tokenizer = converted(tok, tmp_path, eos="<|im_end|>")
    assert stop_ids(tokenizer, ckpt) == [tok.token_to_id("<|im_end|>")]


def test_extra_eos_ids_of_the_checkpoint_come_after_the_tokenizers(tok, tmp_path):
    """generation_config.json's list (kept in tokenizer_meta.json) ends generation too, chat or not."""
    ckpt, tokenizer = converted(tok, tmp_path, eos="<|endoftext|>")
    meta_path = ckpt / "tokenizer_meta.json"
    meta = json.loads(meta_path.read_text())
    start = tok.token_to_id("<|im_start|>")
    meta["eos_ids"] = [tokenizer.eos_id, start]
    meta_path.write_text(json.dumps(meta))
    end = tok.token_to_id("<|im_end|>")
    assert stop_ids(tokenizer, ckpt) == [tokenizer.eos_id, start, end]
    assert stop_ids(tokenizer, ckpt, chat=False) == [tokenizer.eos_id, start]


def test_no_template_and_no_chat_tokens_means_eos_only(tok, tmp_path):
    ckpt, tokenizer = converted(tok, tmp_path, eos="<|endoftext|>", template_in="none")
    assert chat_template_or_none(tokenizer, ckpt) is None
    assert stop_ids(tokenizer, ckpt) == [tokenizer.eos_id]


def test_meshlm_tokenizer_stops_at_its_end_token(tiny_run):
    ckpt = sorted((tiny_run / "checkpoints").iterdir())[-1]
    tokenizer = MeshTokenizer.load(ckpt / "tokenizer.json")
    end = tokenizer.special_ids["<|end|>"]
    assert stop_ids(tokenizer, ckpt) == [tokenizer.eos_id, end]
    assert stop_ids(tokenizer) == [tokenizer.eos_id, end]  # no checkpoint folder (RL from the seeded start)
    assert stop_ids(tokenizer, ckpt, chat=False) == [tokenizer.eos_id]
