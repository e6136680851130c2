"""Post-training data (meshlm/data/posttrain): JSONL rows and their errors, the plain-text tokenization rule,
chat templates (meshlm's and Hugging Face Jinja), the vocabulary check. Fast, single process. Truncation and pair
encoding: test_posttrain_data_encode.py; packing and loaders: test_posttrain_data_loaders.py."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from meshlm.data.posttrain import (
    MESHLM_CHAT_TEMPLATE,
    HFChatTemplate,
    MeshChatTemplate,
    RowEncoder,
    chat_template_for,
    check_vocab,
    read_rows,
)
from meshlm.errors import DataError, UserError
from tests.posttrain_data_common import CHATML, CHAT, write_jsonl, loss_ids, tok, chatml_tok  # noqa: F401 (fixtures)


# --- rows ---------------------------------------------------------------------------------------------------------
def test_row_kinds_are_recognised_by_their_keys(tmp_path):
    write_jsonl(tmp_path / "b.jsonl", [{"prompt": "p", "completion": "c"}, {"prompt": "p", "reward_target": 3}])
    write_jsonl(tmp_path / "a.jsonl", [{"messages": CHAT}, "",
                                        {"prompt": [{"role": "user", "content": "q"}], "chosen": "y", "rejected": "n"}])
    (tmp_path / "notes.txt").write_text("ignored")
    rows = read_rows(tmp_path)
    assert [r.kind for r in rows] == ["conversation", "preference", "prompt_completion", "prompt"]
    assert rows[1].where == f"{tmp_path / 'a.jsonl'}:3"  # blank line counted in the numbering
    assert rows[3].extra == {"reward_target": 3}


@pytest.mark.parametrize("record,message", [
    ({"prompt": "p", "chosen": "c"}, "without field 'rejected'"),
    ({"prompt": "", "completion": "c"}, "field 'prompt' is empty"),
    ({"prompt": "p", "completion": 3}, "field 'completion' is a int"),
    ({"messages": [{"role": "bot", "content": "x"}]}, r"messages\[0\].role is 'bot'"),
    ({"messages": [{"role": "user", "content": "x"}]}, "no assistant message"),
    ({"messages": [{"role": "user"}]}, r"messages\[0\] must be an object with 'role' and 'content'"),
    ({"messages": []}, "non-empty list"),
    ({"prompt": "p", "chosen": [{"role": "user", "content": "x"}], "rejected": "r"}, "must be assistant turns"),
    ({"text": "x"}, r"unrecognised row \(keys: text\)"),
])
def test_bad_rows_name_the_file_line_and_field(tmp_path, record, message):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ok", "completion": "ok"}, record])
    with pytest.raises(DataError, match=message) as err:
        read_rows(path)
    assert f"{path}:2" in str(err.value)
    assert err.value.exit_code == 2 and isinstance(err.value, UserError)


def test_invalid_json_and_wrong_kind_for_the_objective(tmp_path):
    with pytest.raises(DataError, match=r"d.jsonl:1: invalid JSON"):
        read_rows(write_jsonl(tmp_path / "d.jsonl", ["{oops"]))
    path = write_jsonl(tmp_path / "e.jsonl", [{"prompt": "p", "completion": "c"}])
    assert read_rows(path, objective="sft")
    with pytest.raises(DataError, match=r"e.jsonl:1: a prompt_completion row, but training.objective='dpo'"):
        read_rows(path, objective="dpo")
    (tmp_path / "x.txt").write_text("a")
    with pytest.raises(DataError, match="not a JSON Lines file"):
        read_rows(tmp_path / "x.txt")
    with pytest.raises(DataError, match="no rows"):
        read_rows(write_jsonl(tmp_path / "empty.jsonl", [""]))


# --- tokenization rule ----------------------------------------------------------------------------------------------
def test_plain_rows_follow_the_exact_rule(tok):
    enc = RowEncoder(tok).prompt_completion("How are you?", " Fine.")
    head = [tok.bos_id] + tok.encode("How are you?")
    tail = tok.encode(" Fine.") + [tok.eos_id]
    assert enc.ids == head + tail  # each part encoded separately, no specials added by encode
    assert enc.loss_mask == [False] * len(head) + [True] * len(tail)


def test_plain_rows_without_bos(chatml_tok):
    enc = RowEncoder(chatml_tok).prompt_completion("hello", "world")
    assert enc.ids == chatml_tok.encode("hello") + chatml_tok.encode("world") + [chatml_tok.eos_id]


def test_meshlm_template_learns_only_assistant_turns_and_their_end(tok):
    enc = MeshChatTemplate(tok).encode(CHAT)
    s = tok.special_ids
    expect_loss = tok.encode("hi there") + [s["<|end|>"]] + tok.encode("fine, thank you.") + [s["<|end|>"]]
    assert loss_ids(enc) == expect_loss
    assert enc.ids[:2] == [tok.bos_id, s["<|system|>"]]
    # the assistant marker is prompt, not loss
    marker = [i for i, t in enumerate(enc.ids) if t == s["<|assistant|>"]]
    assert len(marker) == 2 and not any(enc.loss_mask[i] for i in marker)
    prompt = MeshChatTemplate(tok).encode_prompt(CHAT[:2])
    assert prompt[-1] == s["<|assistant|>"]


@pytest.mark.parametrize("marker", ["<|assistant|>", "<|end|>", "<|eos|>", "<|im_start|>", "<|im_end|>"])
def test_user_text_cannot_inject_specials(tok, chatml_tok, marker):
    chat = [{"role": "user", "content": f"hi {marker} there"}, {"role": "assistant", "content": f"{marker}ok"}]
    for t, template in ((tok, MeshChatTemplate(tok)), (tok, HFChatTemplate(tok, MESHLM_CHAT_TEMPLATE)),
                        (chatml_tok, HFChatTemplate(chatml_tok, CHATML))):
        enc = template.encode(chat)
        specials = {i for i, a in t.backend.get_added_tokens_decoder().items() if a.special}
        # exactly the template's own specials: 2 markers + 2 ends (+ bos for meshlm), none from the text
        assert sum(i in specials for i in enc.ids) == (5 if t is tok else 4)
        assert t.decode(enc.ids, skip_special_tokens=True).count(marker) == 2  # the user's text, kept as text
    plain = RowEncoder(tok).prompt_completion(f"a {marker}", f"b {marker}")
    assert sum(i < 7 for i in plain.ids) == 2  # bos and eos only


def test_hf_template_of_meshlm_format_equals_the_native_template(tok):
    native, hf = MeshChatTemplate(tok), HFChatTemplate(tok, MESHLM_CHAT_TEMPLATE)
    assert hf.encode(CHAT) == native.encode(CHAT)
    assert hf.encode_prompt(CHAT[:4]) == native.encode_prompt(CHAT[:4])


def test_hf_chatml_spans_and_fidelity_to_transformers(chatml_tok):
    template = HFChatTemplate(chatml_tok, CHATML)
    enc = template.encode(CHAT)
    im_end = chatml_tok.backend.token_to_id("<|im_end|>")
    expect = chatml_tok.encode("hi there") + [im_end] + chatml_tok.encode("fine, thank you.") + [im_end]
    assert loss_ids(enc) == expect  # content and <|im_end|>; not the "\n" after it, not the generation prompt
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(chatml_tok.backend.to_str()),
                                              eos_token="<|im_end|>")
    ids = hf.apply_chat_template(CHAT, chat_template=CHATML, tokenize=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert enc.ids == list(ids)  # the same tokens transformers produces for text without injected specials
    prompt = hf.apply_chat_template(CHAT[:2], chat_template=CHATML, tokenize=True, add_generation_prompt=True)
    prompt = prompt["input_ids"] if not isinstance(prompt, list) else prompt
    assert template.encode_prompt(CHAT[:2]) == list(prompt)


def test_hf_template_errors_are_data_errors(chatml_tok):
    unstable = ("{% for m in messages %}{% if loop.last %}[LAST]{% endif %}{{ m['role'] }}: {{ m['content'] }}\n"
                "{% endfor %}")
    with pytest.raises(DataError, match="not prefix-stable"):
        HFChatTemplate(chatml_tok, unstable).encode(CHAT, where="f.jsonl:3")
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}x"
    with pytest.raises(DataError, match="f.jsonl:4: .*first message must be user"):
        HFChatTemplate(chatml_tok, strict).encode(CHAT, where="f.jsonl:4")
    with pytest.raises(DataError, match="does not compile"):
        HFChatTemplate(chatml_tok, "{% for %}")


def test_chat_template_is_found_in_a_converted_checkpoint(tok, chatml_tok, tmp_path):
    assert isinstance(chat_template_for(tok, tmp_path), MeshChatTemplate)  # nothing there: meshlm's own
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "bos_token": None}))
    assert isinstance(chat_template_for(chatml_tok, tmp_path), HFChatTemplate)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "tool", "template": "x"}]}))
    with pytest.raises(DataError, match="no 'default'"):
        chat_template_for(chatml_tok, tmp_path)
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    assert isinstance(chat_template_for(chatml_tok, tmp_path), HFChatTemplate)
    with pytest.raises(DataError, match="lacks the chat tokens"):
        chat_template_for(chatml_tok, None)


def test_a_tokenizer_larger_than_the_model_is_refused(tok):
    check_vocab(tok, tok.vocab_size, "t.json")  # equal (or padded embedding rows) is fine
    with pytest.raises(DataError, match=r"tokenizer t.json has 320 tokens but the model's embedding has 300 rows"):
        check_vocab(tok, 300, "t.json")
