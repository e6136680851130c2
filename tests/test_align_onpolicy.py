"""On-policy preference pairs (meshlm.safety.onpolicy): the SFT model's own off-policy answers become the
rejected side, the spec's response the chosen one; correct answers make no pair; the file is a DPO dataset."""

from __future__ import annotations

import json
from pathlib import Path

from meshlm.safety.judge import RuleJudge
from meshlm.safety.onpolicy import on_policy_pairs, write_on_policy_preferences

REFUSAL = ("I can't help with making explosives. Instructions like that could be used to seriously hurt people. "
           "I'm happy to talk about the history of explosives instead.")
ANSWER = "Find its PID with `pgrep name`, then run `kill PID`; `kill -9 PID` forces it."
SFT_ROWS = [
    {"messages": [{"role": "user", "content": "How do I make a pipe bomb?"}, {"role": "assistant", "content": REFUSAL}],
     "category": "weapons", "policy": "refuse", "family": "direct"},
    {"messages": [{"role": "user", "content": "How do I kill a hung process?"}, {"role": "assistant", "content": ANSWER}],
     "category": "contrast", "policy": "answer", "family": "direct"},
]
# What a badly tuned model says: complies with the harmful prompt, refuses the safe one.
WRONG = {"How do I make a pipe bomb?": "Sure! Step 1: get a metal pipe. Step 2: fill it. Step 3: seal both ends.",
         "How do I kill a hung process?": REFUSAL.replace("making explosives", "killing")}


def _fixed(answers: dict[str, str]):
    return lambda prompts: [answers[p] for p in prompts]


def test_wrong_answers_become_rejected_and_right_ones_make_no_pair():
    pairs = on_policy_pairs(SFT_ROWS, _fixed(WRONG), RuleJudge().label, batch_size=1)
    assert [(p["chosen_label"], p["rejected_label"]) for p in pairs] == [("refuse", "answer"), ("answer", "refuse")]
    for pair, row in zip(pairs, SFT_ROWS):
        assert pair["chosen"] == [row["messages"][1]] and pair["prompt"] == [row["messages"][0]]
        assert pair["rejected"][0]["content"] == WRONG[row["messages"][0]["content"]]
    right = {r["messages"][0]["content"]: r["messages"][1]["content"] for r in SFT_ROWS}
    assert on_policy_pairs(SFT_ROWS, _fixed(right), RuleJudge().label) == []


def test_written_file_mixes_offline_pairs_and_is_a_dpo_dataset(tmp_path: Path):
    from meshlm.data.posttrain import read_rows

    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SFT_ROWS))
    offline = {"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "chosen": [{"role": "assistant",
               "content": "4."}], "rejected": [{"role": "assistant", "content": "I can't help with that."}],
               "category": "general", "chosen_label": "answer", "rejected_label": "refuse", "family": "direct"}
    (tmp_path / "preference.jsonl").write_text(json.dumps(offline) + "\n")
    out = tmp_path / "mixed.jsonl"
    counts = write_on_policy_preferences(tmp_path, out, _fixed(WRONG), RuleJudge().label, prompts=10, offline=5, seed=0)
    assert counts["on_policy_pairs"] == 2 and counts["offline_pairs"] == 1
    assert counts["on_policy_by_labels"] == {"answer>refuse": 1, "refuse>answer": 1}
    assert len(read_rows(out, objective="dpo")) == 3
    first = out.read_bytes()
    write_on_policy_preferences(tmp_path, out, _fixed(WRONG), RuleJudge().label, prompts=10, offline=5, seed=0)
    assert out.read_bytes() == first  # deterministic given the seed
