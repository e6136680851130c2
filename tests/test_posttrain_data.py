"""Post-training data (meshlm/data/posttrain): rows, tokenization rule, chat templates, truncation, packing and
loaders. Fast, single process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from meshlm.data.posttrain import (
    MESHLM_CHAT_TEMPLATE,
    HFChatTemplate,
    MeshChatTemplate,
    PreferenceLoader,
    PromptLoader,
    RowEncoder,
    SFTLoader,
    build_sequence,
    chat_template_for,
    check_vocab,
    encode_examples,
    encode_pairs,
    encode_prompts,
    pad_id_for,
    parse_row,
    plan_packing,
    read_rows,
)
from meshlm.data.posttrain.templates import Encoded
from meshlm.errors import DataError, UserError
from meshlm.objectives.base import IGNORE_INDEX
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


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def _loss_ids(enc: Encoded) -> list[int]:
    return [i for i, m in zip(enc.ids, enc.loss_mask) if m]


# --- rows ---------------------------------------------------------------------------------------------------------
def test_row_kinds_are_recognised_by_their_keys(tmp_path):
    _write_jsonl(tmp_path / "b.jsonl", [{"prompt": "p", "completion": "c"}, {"prompt": "p", "reward_target": 3}])
    _write_jsonl(tmp_path / "a.jsonl", [{"messages": CHAT}, "",
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
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ok", "completion": "ok"}, record])
    with pytest.raises(DataError, match=message) as err:
        read_rows(path)
    assert f"{path}:2" in str(err.value)
    assert err.value.exit_code == 2 and isinstance(err.value, UserError)


def test_invalid_json_and_wrong_kind_for_the_objective(tmp_path):
    with pytest.raises(DataError, match=r"d.jsonl:1: invalid JSON"):
        read_rows(_write_jsonl(tmp_path / "d.jsonl", ["{oops"]))
    path = _write_jsonl(tmp_path / "e.jsonl", [{"prompt": "p", "completion": "c"}])
    assert read_rows(path, objective="sft")
    with pytest.raises(DataError, match=r"e.jsonl:1: a prompt_completion row, but training.objective='dpo'"):
        read_rows(path, objective="dpo")
    (tmp_path / "x.txt").write_text("a")
    with pytest.raises(DataError, match="not a JSON Lines file"):
        read_rows(tmp_path / "x.txt")
    with pytest.raises(DataError, match="no rows"):
        read_rows(_write_jsonl(tmp_path / "empty.jsonl", [""]))


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
    assert _loss_ids(enc) == expect_loss
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
    assert _loss_ids(enc) == expect  # content and <|im_end|>; not the "\n" after it, not the generation prompt
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


def test_preference_rows_plain_and_chat(tok):
    enc = RowEncoder(tok)
    plain = parse_row({"prompt": "Q?", "chosen": "yes", "rejected": "no way"}, "x:1")
    chosen, rejected = enc.pair(plain)
    assert chosen == enc.prompt_completion("Q?", "yes") and rejected == enc.prompt_completion("Q?", "no way")
    chat = parse_row({"prompt": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                                 {"role": "user", "content": "and?"}],
                      "chosen": [{"role": "assistant", "content": "fine"}], "rejected": "bad"}, "x:2")
    chosen, rejected = enc.pair(chat)
    end = tok.special_ids["<|end|>"]
    assert _loss_ids(chosen) == tok.encode("fine") + [end]  # the earlier assistant turn is prompt here
    assert _loss_ids(rejected) == tok.encode("bad") + [end]


# --- truncation -----------------------------------------------------------------------------------------------------
def test_truncation_keeps_the_prompts_end_and_counts(tok):
    prompt = " ".join(f"w{i}" for i in range(40))
    row = parse_row({"prompt": prompt, "completion": "The answer is 42."}, "x:1")
    full = RowEncoder(tok).example(row)
    (enc,), stats = encode_examples([row], RowEncoder(tok), max_tokens=30)
    completion = tok.encode("The answer is 42.") + [tok.eos_id]
    assert len(enc.ids) == 30 and enc.ids[0] == tok.bos_id
    assert enc.ids[-len(completion):] == completion  # the completion is whole
    assert enc.ids[1 : 30 - len(completion)] == full.ids[len(full.ids) - 29 : len(full.ids) - len(completion)]
    assert stats.truncated_rows == 1 and stats.truncated_tokens == len(full.ids) - 30
    assert stats.loss_tokens == len(completion)


def test_long_responses_are_cut_at_their_end_and_empty_rows_dropped(tok):
    row = parse_row({"prompt": "Q", "completion": " ".join(["hello world"] * 30)}, "x:1")
    (enc,), stats = encode_examples([row], RowEncoder(tok), max_tokens=16)
    assert len(enc.ids) == 16 and enc.ids[-1] != tok.eos_id and stats.truncated_rows == 1
    kept, stats = encode_examples([row, row], RowEncoder(tok), max_tokens=1)
    assert kept == [] and stats.dropped_no_loss_tokens == 2 and stats.dropped_examples == ["x:1", "x:1"]


def test_pairs_share_one_prompt_cut_and_prompts_keep_their_end(tok):
    row = parse_row({"prompt": " ".join(["hello"] * 30), "chosen": "yes", "rejected": "no, thank you, no"}, "x:1")
    (pair,), stats = encode_pairs([row], RowEncoder(tok), max_tokens=20)
    assert pair.chosen.ids[: pair.prompt_len] == pair.rejected.ids[: pair.prompt_len]
    assert len(pair.rejected.ids) == 20 and pair.rejected.ids[-1] == tok.eos_id
    assert stats.truncated_rows == 1
    prompts, pstats = encode_prompts([parse_row({"prompt": " ".join(["hello"] * 30) + " END"}, "x:2")],
                                     RowEncoder(tok), max_tokens=8)
    assert len(prompts[0]) == 8 and prompts[0][0] == tok.bos_id
    assert tok.decode(prompts[0]).endswith(" END") and pstats.truncated_rows == 1


# --- packing --------------------------------------------------------------------------------------------------------
def _examples(n: int, seed: int = 0) -> list[Encoded]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(3, 15, (1,), generator=g))
        prompt = int(torch.randint(1, length - 1, (1,), generator=g))
        ids = torch.randint(7, 50, (length,), generator=g).tolist()
        out.append(Encoded(ids, [False] * prompt + [True] * (length - prompt)))
    return out


def test_packing_places_every_row_once_within_seq_len():
    lengths = [len(e.ids) for e in _examples(200)]
    bins = plan_packing(lengths, 32)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert all(sum(lengths[i] for i in b) <= 32 for b in bins)
    assert len(bins) <= -(-sum(lengths) // 32) + 3  # near the lower bound on sequences
    assert plan_packing(lengths, 32) == bins
    with pytest.raises(DataError, match="does not fit seq_len"):
        plan_packing([5, 40], 32)


def test_packed_sequence_layout():
    ex = _examples(3, seed=1)
    seq = build_sequence(ex, [0, 1, 2], 48, pad_id=0)
    start = 0
    for doc, e in enumerate(ex):
        n = len(e.ids)
        assert seq["input_ids"][start : start + n].tolist() == e.ids
        assert seq["position_ids"][start : start + n].tolist() == list(range(n))
        assert (seq["document_ids"][start : start + n] == doc).all()
        labels = seq["labels"][start : start + n].tolist()
        assert labels[-1] == IGNORE_INDEX  # never the next row's first token
        assert labels[:-1] == [t if m else IGNORE_INDEX for t, m in zip(e.ids[1:], e.loss_mask[1:])]
        start += n
    assert (seq["document_ids"][start:] == 3).all() and (seq["labels"][start:] == IGNORE_INDEX).all()
    assert seq["position_ids"][start:].tolist() == list(range(48 - start))


class _DocAttentionLM(torch.nn.Module):
    """A one-layer causal LM that attends within a document and embeds position ids: the contract a packed batch
    needs from the model."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.pos = torch.nn.Embedding(64, 16), torch.nn.Embedding(64, 16)
        self.qkv, self.out = torch.nn.Linear(16, 48), torch.nn.Linear(16, 64)

    def forward(self, input_ids, position_ids, document_ids):
        x = self.tok(input_ids) + self.pos(position_ids)  # (B, T, D)
        q, k, v = self.qkv(x).chunk(3, -1)
        T = input_ids.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        same_doc = document_ids[:, :, None] == document_ids[:, None, :]  # (B, T, T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal & same_doc)
        return self.out(x + y)  # (B, T, V)


def _loss_sum_and_grads(model, batch):
    model.zero_grad()
    logits = model(batch["input_ids"], batch["position_ids"], batch["document_ids"])
    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_packed_and_padded_batches_give_the_same_loss_and_gradients():
    ex = _examples(12, seed=2)
    model = _DocAttentionLM()
    packed = SFTLoader(ex, 32, 1, pad_id=0, packing=True, shuffle=False)
    padded = SFTLoader(ex, 32, 1, pad_id=0, packing=False, shuffle=False)
    assert packed.num_sequences < padded.num_sequences == 12
    batch_p = _stack([packed.next_batch() for _ in range(packed.num_sequences)])
    batch_u = _stack([padded.next_batch() for _ in range(padded.num_sequences)])
    assert int((batch_p["labels"] != IGNORE_INDEX).sum()) == int((batch_u["labels"] != IGNORE_INDEX).sum())
    loss_p, grads_p = _loss_sum_and_grads(model, batch_p)
    loss_u, grads_u = _loss_sum_and_grads(model, batch_u)
    torch.testing.assert_close(loss_p, loss_u, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads_p, grads_u):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # fp32 sums in another order


def _stack(batches):
    return {k: torch.cat([b[k] for b in batches]) for k in batches[0]}


# --- loaders --------------------------------------------------------------------------------------------------------
def test_sft_loader_is_deterministic_rank_aware_and_resumable():
    ex = _examples(40, seed=3)
    full = SFTLoader(ex, 24, 4, pad_id=0, seed=5)
    batches = [full.next_batch() for _ in range(6)]  # crosses an epoch boundary
    assert full.num_sequences < 24
    ranks = [SFTLoader(ex, 24, 4, pad_id=0, seed=5, dp_rank=r, dp_size=2) for r in range(2)]
    for b in batches[:3]:
        parts = [rk.next_batch() for rk in ranks]
        for k in b:
            assert torch.equal(b[k], torch.cat([p[k] for p in parts]))
    resumed = SFTLoader(ex, 24, 4, pad_id=0, seed=0, dp_size=4, dp_rank=1)
    resumed.load_state_dict(json.loads(json.dumps(ranks[0].state_dict())))  # saved under dp 2, JSON round trip
    assert torch.equal(resumed.next_batch()["input_ids"], batches[3]["input_ids"][1:2])
    one = SFTLoader(ex, 24, 1, pad_id=0, seed=5)
    epoch = [tuple(one.next_batch()["input_ids"][0].tolist()) for _ in range(one.num_sequences)]
    assert len(set(epoch)) == one.num_sequences  # each sequence once per epoch


def test_loader_state_refuses_other_data():
    a = SFTLoader(_examples(20, seed=4), 24, 2, pad_id=0)
    b = SFTLoader(_examples(20, seed=5), 24, 2, pad_id=0)
    with pytest.raises(DataError, match="changed since the checkpoint"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(DataError, match="seq_len"):
        SFTLoader(_examples(20, seed=4), 30, 2, pad_id=0).load_state_dict(a.state_dict())
    with pytest.raises(DataError, match="not divisible"):
        SFTLoader(_examples(20, seed=4), 24, 3, pad_id=0, dp_size=2)
    with pytest.raises(DataError, match="every row was dropped"):
        SFTLoader([], 24, 2, pad_id=0)


def test_preference_loader_layout(tok, tmp_path):
    rows = read_rows(_write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "hello", "chosen": "fine", "rejected": "no, thank you"},
        {"prompt": "how are you?", "chosen": "I am fine", "rejected": "no"}]), objective="dpo")
    pairs, _ = encode_pairs(rows, RowEncoder(tok), max_tokens=16)
    loader = PreferenceLoader(pairs, 16, 2, pad_id=pad_id_for(tok), shuffle=False)
    batch = loader.next_batch()
    assert batch["input_ids"].shape == (4, 16)
    for row, (pair, side) in enumerate([(pairs[0], "chosen"), (pairs[1], "chosen"),
                                        (pairs[0], "rejected"), (pairs[1], "rejected")]):
        enc = getattr(pair, side)
        n = int(batch["lengths"][row])
        assert n == len(enc.ids) and batch["input_ids"][row, :n].tolist() == enc.ids
        assert batch["attention_mask"][row].tolist() == [True] * n + [False] * (16 - n)
        p = int(batch["prompt_lengths"][row])
        assert p == pair.prompt_len
        labels = batch["labels"][row]
        # labels are the response tokens (+eos) predicted from position p-1 on; nothing before, nothing after
        assert (labels[: p - 1] == IGNORE_INDEX).all() and (labels[n - 1 :] == IGNORE_INDEX).all()
        assert labels[p - 1 : n - 1].tolist() == enc.ids[p:]
        assert (batch["document_ids"][row, n:] == 1).all()
    other = PreferenceLoader(pairs, 16, 2, pad_id=pad_id_for(tok), shuffle=False)
    other.load_state_dict(loader.state_dict())
    assert other.samples_consumed == 2


def test_packing_invariance_on_the_debug_llama():
    """The real model (document_ids / position_ids inputs): packed and padded batches, same loss sum and grads."""
    from meshlm.models import build_model, flavor_config

    cfg = flavor_config("debug")
    model = build_model(cfg, "cpu", seed=0)
    ex = [Encoded([i % 2000 + 7 for i in e.ids], e.loss_mask) for e in _examples(10, seed=6)]
    results = []
    for packing in (True, False):
        loader = SFTLoader(ex, 32, 1, pad_id=0, packing=packing, shuffle=False)
        batch = _stack([loader.next_batch() for _ in range(loader.num_sequences)])
        model.zero_grad()
        logits = model(batch["input_ids"], position_ids=batch["position_ids"], document_ids=batch["document_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX,
                               reduction="sum")
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss_p, grads_p), (loss_u, grads_u) = results
    torch.testing.assert_close(loss_p, loss_u, rtol=1e-6, atol=1e-5)
    for a, b in zip(grads_p, grads_u):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # fp32 sums over rows in another order


def test_prompt_loader_keeps_extras_and_resumes(tok, tmp_path):
    rows = read_rows(_write_jsonl(tmp_path / "q.jsonl", [{"prompt": f"question {i}", "answer": i} for i in range(6)]),
                     objective="grpo")
    prompts, _ = encode_prompts(rows, RowEncoder(tok), max_tokens=16)
    loader = PromptLoader(prompts, 4, extras=[r.extra for r in rows], max_prompt_tokens=16, seed=1)
    first, second = loader.next_batch(), loader.next_batch()
    for batch in (first, second):
        for i, ids, extra in zip(batch["index"], batch["prompt_ids"], batch["extra"]):
            assert ids == prompts[i] and extra == {"answer": i}
    assert sorted(first["index"] + second["index"][:2]) == list(range(6))  # the first epoch, in some order
    rank1 = PromptLoader(prompts, 4, extras=[r.extra for r in rows], max_prompt_tokens=16, seed=1, dp_rank=1,
                         dp_size=2)
    rank1.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    third = PromptLoader(prompts, 4, extras=[r.extra for r in rows], max_prompt_tokens=16, seed=1)
    third.load_state_dict(loader.state_dict())
    assert rank1.next_batch()["index"] == third.next_batch()["index"][2:]


def test_a_tokenizer_larger_than_the_model_is_refused(tok):
    check_vocab(tok, tok.vocab_size, "t.json")  # equal (or padded embedding rows) is fine
    with pytest.raises(DataError, match=r"tokenizer t.json has 320 tokens but the model's embedding has 300 rows"):
        check_vocab(tok, 300, "t.json")
