"""Gemma's sentencepiece vocabulary rebuilt from ``tokenizer.ggml.*`` (meshlm/interop/gguf_tokenizer.py): the ids
equal transformers' own GGUF loader (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``) on a few hundred
strings with byte-fallback characters (emoji, CJK, control characters), leading spaces, runs of spaces and
newlines; decoding gives the text back; bos, eos (with ``<end_of_turn>``) and the chat template are recorded.
The file is a small Gemma 3 GGUF the tests write (tests/gemma3_gguf.py), whose scores disagree with the order of
its tokens: ranking the derived merges by score instead of position fails the comparison."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from gemma3_gguf import CONTROL_TOKENS, GEMMA_TEMPLATE, sentencepiece_vocab, write_gemma3_gguf  # noqa: E402
from meshlm.data.posttrain.templates import read_hf_chat_template  # noqa: E402
from meshlm.errors import CheckpointError  # noqa: E402
from meshlm.interop import gguf_tokenizer  # noqa: E402
from meshlm.interop.gguf import convert_from_gguf  # noqa: E402
from meshlm.interop.gguf_file import GGUFFile  # noqa: E402
from meshlm.tokenizer import MeshTokenizer  # noqa: E402

transformers.utils.logging.disable_progress_bar()
SAMPLES = ["the", " model", "data", "training", "Paris", "naïve", "café", "東京", "中文", "🙂", "🤖🧠", "👩‍👩‍👧",
           "\n", "\n\n", "\t", "  ", "   ", "\x01", "\x7f", "\u200b", "12345", "$5.78", "<div>", "</div>", "it's",
           "Ünïcödé", "\r\n", "—", "x" * 20]


def texts(n: int = 300) -> list[str]:
    rng = random.Random(0)
    out = list(SAMPLES) + [" leading", "  two leading", "trailing ", "\nstarts with a newline"]
    while len(out) < n:
        out.append("".join(p + rng.choice(["", " ", "  ", "\n"]) for p in rng.choices(SAMPLES, k=rng.randint(1, 7))))
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("spm")
    write_gemma3_gguf(root / "tiny.gguf")
    convert_from_gguf(root / "tiny.gguf", root / "run")
    return root / "tiny.gguf", root / "run" / "checkpoints" / "step-00000000"


@pytest.fixture(scope="module")
def reference(converted):
    path = converted[0]
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_ids_equal_transformers_gguf_loader(converted, reference):
    ours = MeshTokenizer.load(converted[1] / "tokenizer.json")
    for text in texts():
        assert ours.prompt_ids(text) == reference(text)["input_ids"], repr(text)
        assert ours.decode(ours.encode(text)) == text, repr(text)  # byte fallback keeps every character


def test_byte_fallback_spells_unknown_characters_in_bytes(converted):
    ours = MeshTokenizer.load(converted[1] / "tokenizer.json")
    tokens, _, _ = sentencepiece_vocab()
    ids = ours.encode("🙂")
    assert [tokens[i] for i in ids] == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]
    assert tokens[ours.encode("a  b")[1]] == "  "  # the run of spaces, stored with real spaces, is found


def test_ranking_merges_by_score_would_tokenise_differently(converted, reference, monkeypatch):
    """The order that matters is the tokens' positions: with the file's (shuffled) scores instead, ids differ."""
    gguf = GGUFFile(converted[0])
    scores, derive = gguf.meta["tokenizer.ggml.scores"], gguf_tokenizer.sentencepiece_merges

    def by_score(tokens, vocab):  # best score first (stable: position breaks ties)
        return sorted(derive(tokens, vocab), key=lambda pair: -scores[vocab["".join(pair)]])

    monkeypatch.setattr(gguf_tokenizer, "sentencepiece_merges", by_score)
    tok = gguf_tokenizer.tokenizer_from_gguf(gguf.meta, converted[0], len(scores), 128)[0]
    assert any(tok.encode(t).ids != reference(t)["input_ids"] for t in texts(100))


def test_specials_template_and_eos(converted):
    ckpt = converted[1]
    meta = json.loads((ckpt / "tokenizer_meta.json").read_text())
    end_of_turn = CONTROL_TOKENS.index("<end_of_turn>")
    assert (meta["bos_token"], meta["eos_token"], meta["pad_token"]) == ("<bos>", "<eos>", "<pad>")
    assert meta["add_bos_token"] is True and meta["eos_ids"] == [1, end_of_turn]
    assert read_hf_chat_template(ckpt)[0] == GEMMA_TEMPLATE
    ours = MeshTokenizer.load(ckpt / "tokenizer.json")
    assert ours.encode("<start_of_turn>") != [CONTROL_TOKENS.index("<start_of_turn>")]  # user text stays text


def test_sentencepiece_of_another_architecture_is_refused(converted):
    meta = dict(GGUFFile(converted[0]).meta, **{"general.architecture": "llama"})
    with pytest.raises(CheckpointError, match="sentencepiece vocabulary of a 'llama' file"):
        gguf_tokenizer.tokenizer_from_gguf(meta, converted[0], len(meta["tokenizer.ggml.tokens"]), 128)


def test_a_run_of_spaces_stored_twice_is_refused(converted):
    meta = GGUFFile(converted[0]).meta
    tokens = list(meta["tokenizer.ggml.tokens"])
    tokens[-1] = gguf_tokenizer.SPACE * 2  # beside "  " (two real spaces), which is looked up as this
    with pytest.raises(CheckpointError, match="run of 2 spaces both as spaces and as"):
        gguf_tokenizer.tokenizer_from_gguf({**meta, "tokenizer.ggml.tokens": tokens}, converted[0], len(tokens), 128)


def test_export_fields_give_back_the_file_vocabulary(converted, reference):
    """tokenizer_to_gguf of the rebuilt tokenizer: the file's tokens (runs of spaces spelled with spaces again) and
    token types, scores falling with position (so score and position rank merges alike), and a rebuild from
    them that tokenises as transformers does on the original file."""
    original = GGUFFile(converted[0]).meta
    ours = MeshTokenizer.load(converted[1] / "tokenizer.json")
    fields = gguf_tokenizer.tokenizer_to_gguf(ours, {"add_bos_token": True}, len(original["tokenizer.ggml.tokens"]),
                                              converted[1])
    assert fields["model"] == "llama" and fields["merges"] == [] and (fields["bos"], fields["unk"]) == (2, 3)
    assert fields["tokens"] == original["tokenizer.ggml.tokens"]
    assert fields["types"] == original["tokenizer.ggml.token_type"]
    normal = [s for s, t in zip(fields["scores"], fields["types"]) if t == gguf_tokenizer.NORMAL]
    assert normal == sorted(normal, reverse=True)
    meta = {**original, "tokenizer.ggml.tokens": fields["tokens"], "tokenizer.ggml.token_type": fields["types"],
            "tokenizer.ggml.scores": fields["scores"]}
    rebuilt = gguf_tokenizer.tokenizer_from_gguf(meta, converted[0], len(fields["tokens"]), 128)[0]
    for text in texts(100):
        assert rebuilt.encode(text).ids == reference(text)["input_ids"], repr(text)
