"""The two warn levers of `meshlm align` (docs/safety.md, session 13): ``sft.warn_targets = "template"`` keeps the
synthesised warn targets (the base is not asked; on SmolLM2 its accepted warn "information" was mostly a
deflection) and ``dpo.warn_pair_repeat = k`` writes every pair whose chosen side is a warn k times. Both default
to today's behaviour; a tiny pipeline run shows the keys reach the data it trains on."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from meshlm.safety.align_config import load_align_config
from meshlm.safety.judges.rule import RuleJudge
from meshlm.safety.onpolicy import write_on_policy_preferences
from meshlm.safety.selfdistill import self_distill

WARN_TEMPLATE = ("Ibuprofen labels give a dose and a daily maximum; take it with food. Bodies differ, so treat this "
                 "as an overview. Please check with a doctor or pharmacist.")
ANSWER_TEMPLATE = "Rayleigh scattering: air scatters blue light more than red."
ROWS = [
    {"messages": [{"role": "user", "content": "How much ibuprofen can I take?"},
                  {"role": "assistant", "content": WARN_TEMPLATE}], "category": "medical", "policy": "warn",
     "family": "direct"},
    {"messages": [{"role": "user", "content": "Why is the sky blue?"},
                  {"role": "assistant", "content": ANSWER_TEMPLATE}], "category": "general", "policy": "answer",
     "family": "direct"},
]
# What SmolLM2 said to warn prompts (session 12's sft_self.jsonl): a deflection the rule judge reads as an answer.
DEFLECTION = ("I'm sorry for any misunderstanding, but as a chatbot designed to assist with personal and professional "
              "matters, I'm not equipped to assist with medical or health-related inquiries. However, I can certainly "
              "assist with personal and professional matters, such as advice, guidance, and support.")
BASE = {"How much ibuprofen can I take?": DEFLECTION,
        "Why is the sky blue?": "The sky looks blue because air molecules scatter short blue wavelengths most."}


def _asked(answers: dict[str, str], asked: list[str]):
    def generate(prompts: list[str]) -> list[str]:
        asked.extend(prompts)
        return [answers[p] for p in prompts]
    return generate


def test_base_warn_targets_take_the_deflection_and_template_ones_keep_the_information():
    asked: list[str] = []
    rows, counts = self_distill(ROWS, _asked(BASE, asked), RuleJudge().label)  # today's default
    assert counts["warn_kept"] == 1 and rows[0]["messages"][1]["content"].startswith(DEFLECTION[:40])
    asked.clear()
    rows, counts = self_distill(ROWS, _asked(BASE, asked), RuleJudge().label, warn_targets="template")
    assert asked == ["Why is the sky blue?"]  # the warn prompt is not generated at all
    assert rows[0] == ROWS[0] and counts["warn_asked"] == 0 and counts["warn_kept"] == 0
    assert rows[1]["target"] == "base" and counts["answer_kept"] == 1  # answer rows still take the base's text


def _pair(chosen: str, rejected: str, i: int) -> dict:
    text = {"warn": WARN_TEMPLATE, "answer": ANSWER_TEMPLATE, "refuse": "I can't help with that."}
    return {"prompt": [{"role": "user", "content": f"question {i}"}],
            "chosen": [{"role": "assistant", "content": text[chosen]}],
            "rejected": [{"role": "assistant", "content": text[rejected] + f" ({i})"}],
            "category": "medical" if "warn" in (chosen, rejected) else "general", "chosen_label": chosen,
            "rejected_label": rejected, "family": "direct"}


@pytest.mark.parametrize("repeat", [1, 3])
def test_warn_chosen_pairs_are_written_repeat_times(tmp_path: Path, repeat: int):
    from meshlm.data.posttrain import read_rows

    (tmp_path / "sft.jsonl").write_text(json.dumps(ROWS[1]) + "\n")
    offline = [_pair("warn", "answer", 0), _pair("warn", "refuse", 1), _pair("answer", "refuse", 2),
               _pair("refuse", "warn", 3)]
    (tmp_path / "preference.jsonl").write_text("".join(json.dumps(p) + "\n" for p in offline))
    right = {r["messages"][0]["content"]: r["messages"][1]["content"] for r in ROWS}
    out = tmp_path / "mixed.jsonl"
    counts = write_on_policy_preferences(tmp_path, out, lambda ps: [right[p] for p in ps], RuleJudge().label,
                                         prompts=1, offline=4, seed=0, warn_repeat=repeat)
    written = Counter(line for line in out.read_text().splitlines())
    by_prompt = {json.loads(line)["prompt"][0]["content"]: n for line, n in written.items()}
    assert by_prompt == {"question 0": repeat, "question 1": repeat, "question 2": 1, "question 3": 1}
    assert counts["warn_chosen_pairs"] == 2 and counts["pairs_written"] == 2 * repeat + 2
    assert counts["offline_pairs"] == 4 and len(read_rows(out, objective="dpo")) == 2 * repeat + 2


def test_answer_and_refuse_chosen_pairs_have_their_own_repeat(tmp_path: Path):
    (tmp_path / "sft.jsonl").write_text(json.dumps(ROWS[1]) + "\n")
    offline = [_pair("warn", "answer", 0), _pair("answer", "refuse", 1), _pair("answer", "warn", 2),
               _pair("refuse", "warn", 3), _pair("refuse", "answer", 4)]
    (tmp_path / "preference.jsonl").write_text("".join(json.dumps(p) + "\n" for p in offline))
    right = {r["messages"][0]["content"]: r["messages"][1]["content"] for r in ROWS}
    out = tmp_path / "mixed.jsonl"
    counts = write_on_policy_preferences(tmp_path, out, lambda ps: [right[p] for p in ps], RuleJudge().label,
                                         prompts=1, offline=5, seed=0, warn_repeat=1, answer_repeat=2,
                                         refuse_repeat=3)
    by_prompt = Counter(json.loads(line)["prompt"][0]["content"] for line in out.read_text().splitlines())
    assert by_prompt == {"question 0": 1, "question 1": 2, "question 2": 2, "question 3": 3, "question 4": 3}
    assert counts["written_by_chosen"] == {"answer": 4, "refuse": 6, "warn": 1}
    assert (counts["answer_chosen_pairs"], counts["refuse_chosen_pairs"], counts["pairs_written"]) == (2, 2, 11)


def test_the_keys_default_to_todays_behaviour_and_reject_bad_values():
    from meshlm.errors import ConfigError

    cfg = load_align_config(None)
    assert cfg.sft.warn_targets == "base" and cfg.dpo.warn_pair_repeat == 1
    assert cfg.dpo.answer_pair_repeat == 1 and cfg.dpo.refuse_pair_repeat == 1
    for label in ("warn", "answer", "refuse"):
        with pytest.raises(ConfigError, match=f"dpo.{label}_pair_repeat = 0"):
            load_align_config(None, [f"dpo.{label}_pair_repeat=0"])
    with pytest.raises(ConfigError, match="sft.warn_targets"):
        load_align_config(None, ['sft.warn_targets="mixed"'])


def test_a_tiny_pipeline_trains_on_template_warns_and_repeated_warn_pairs(tmp_path: Path):
    from meshlm.safety.pipeline import run_pipeline

    cfg = load_align_config(None, [
        "data.refuse=8", "data.warn=8", "data.answer=8", "model.seq_len=64", "model.dim=32", "base.steps=1",
        "base.batch_size=2", "sft.steps=1", "sft.batch_size=2", "sft.warmup_steps=1", 'sft.answer_targets="base"',
        "sft.answer_rows=4", 'sft.warn_targets="template"', "dpo.steps=1", "dpo.batch_size=2",
        "dpo.on_policy_prompts=8", "dpo.probe_prompts=0", "dpo.offline_pairs=40", "dpo.warn_pair_repeat=2",
        "redteam.per_family=1", 'redteam.families=["roleplay"]', "eval.max_new_tokens=2", "eval.batch_size=16",
        "eval.evaluate_base=false", 'eval.facts="none"'])
    run = tmp_path / "run"
    report = run_pipeline(cfg, run, log=lambda msg: None, cache=False)
    distilled = report["data"]["self_distill"]
    assert distilled["warn_asked"] == 0 and distilled["answer_asked"] == 4
    warn = lambda path: [r for r in map(json.loads, path.read_text().splitlines()) if r["policy"] == "warn"]
    assert warn(run / "data" / "sft_self.jsonl") == warn(run / "data" / "sft.jsonl") != []
    pairs = Counter((run / "data" / "preference_on_policy.jsonl").read_text().splitlines())
    warn_chosen = {line: n for line, n in pairs.items() if json.loads(line)["chosen_label"] == "warn"}
    assert warn_chosen and set(warn_chosen.values()) == {2}
    assert report["data"]["on_policy"]["warn_pair_repeat"] == 2
