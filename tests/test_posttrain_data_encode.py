"""Post-training data (meshlm/data/posttrain/encode.py): preference rows as pairs (plain and chat) and the
truncation policy (the prompt keeps its end, responses their start, pairs share one prompt cut). Fast."""

from __future__ import annotations

import pytest

from meshlm.data.posttrain import (
    RowEncoder,
    encode_examples,
    encode_pairs,
    encode_prompts,
    parse_row,
)
from tests.posttrain_data_common import loss_ids, tok  # noqa: F401 (fixtures)


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
    assert loss_ids(chosen) == tok.encode("fine") + [end]  # the earlier assistant turn is prompt here
    assert loss_ids(rejected) == tok.encode("bad") + [end]


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
