"""Shared pieces of the post-training data tests (tests/test_posttrain_data*.py): tokenizers, a chat, helpers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from meshlm.data.posttrain.templates import Encoded
from meshlm.tokenizer import MeshTokenizer

TEXTS = ["hello world, how are you today? I am fine, thank you.", "The answer is 42.",
         "user assistant system"] * 20
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi there"}, {"role": "user", "content": "how are you?"},
        {"role": "assistant", "content": "fine, thank you."}]


@pytest.fixture(scope="module")
def tok() -> MeshTokenizer:
    return MeshTokenizer.train(TEXTS, 320)


@pytest.fixture(scope="module")
def chatml_tok() -> MeshTokenizer:
    """A foreign tokenizer with ChatML specials and no bos (like Qwen's)."""
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=320, show_progress=False,
                          special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return MeshTokenizer(t, roles={"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>"})


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def loss_ids(enc: Encoded) -> list[int]:
    return [i for i, m in zip(enc.ids, enc.loss_mask) if m]

