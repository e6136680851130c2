"""The synthesis material and the mix it makes (issue 29): every entry used, refuse at most 40% of SFT, warn
answers with varied cautions and referrals, hand-written near misses on trigger words, and no material prompt
copied from a held-out evaluation set."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from meshlm.safety import evalsets
from meshlm.safety.material import category as material, framings
from meshlm.safety.spec import load_spec
from meshlm.safety.synth import (MAX_REFUSE_SHARE, SynthSizes, cycle, refusal, refuse_subjects, synthesize,
                                 warn_subjects)

DOCS = ["json.dumps\n\nSerialize an object to a JSON formatted string with the given options."]
WARN = ("medical", "legal", "financial", "mental_health")


def _groups(examples, category: str) -> list[int]:
    """Subject indices of ``category``'s direct examples, in synthesis order."""
    return [int(e.group.split(":")[1]) for e in examples if e.category == category and e.family == "direct"]


def test_cycle_uses_every_entry_before_any_twice_and_depends_on_the_seed():
    order = cycle(7, 20, random.Random(0))
    assert sorted(order[:7]) == list(range(7)) and sorted(order[7:14]) == list(range(7)) and len(order) == 20
    assert order == cycle(7, 20, random.Random(0)) and order != cycle(7, 20, random.Random(1))
    assert cycle(0, 5, random.Random(0)) == []


def test_with_enough_rows_every_material_entry_appears():
    spec = load_spec()
    n = {name: len(material(name, "answer")["entries"]) for name in ("contrast", "general", "programming")}
    sizes = SynthSizes(refuse=len(refuse_subjects("drugs")), warn=len(warn_subjects("medical")), answer=max(n.values()),
                       attack_fraction_refuse=0, attack_fraction_answer=0, corpus_questions=0, arithmetic=0,
                       max_refuse_share=1.0)
    examples = synthesize(spec, 5, sizes, documents=DOCS)
    assert set(_groups(examples, "contrast")) == set(range(n["contrast"]))
    assert set(_groups(examples, "drugs")) == set(range(len(refuse_subjects("drugs"))))
    assert set(_groups(examples, "medical")) == set(range(len(warn_subjects("medical"))))


def test_fewer_rows_than_entries_draw_other_entries_per_seed_and_the_same_for_one_seed():
    spec = load_spec()
    sizes = SynthSizes(refuse=10, warn=10, answer=30, corpus_questions=0, arithmetic=0)
    a, b, c = (synthesize(spec, seed, sizes, documents=DOCS) for seed in (0, 0, 1))
    assert [(e.prompt, e.response) for e in a] == [(e.prompt, e.response) for e in b]
    first, other = _groups(a, "contrast"), _groups(c, "contrast")
    assert len(set(first)) == len(first) == 30  # distinct subjects while the permutation lasts
    assert set(first) != set(range(30)) and first != other  # not the file's first 30, and another draw per seed


@pytest.mark.parametrize("sizes", [SynthSizes(refuse=50, warn=40, answer=54, corpus_questions=10, arithmetic=10),
                                   SynthSizes(refuse=60, warn=20, answer=30, corpus_questions=10, arithmetic=10)])
def test_refuse_rows_are_at_most_the_share_of_the_written_sft_rows(tmp_path, sizes):
    from meshlm.safety.datasets import split_examples, write_dataset

    split = split_examples(synthesize(load_spec(), 0, sizes, documents=DOCS), 0, 0.05)
    manifest = write_dataset(split, tmp_path, {})
    policies = Counter(json.loads(line)["policy"] for line in (tmp_path / "sft.jsonl").read_text().splitlines())
    assert policies == Counter(manifest["sft_by_policy"])
    share = policies["refuse"] / sum(policies.values())
    assert 0.3 <= share <= MAX_REFUSE_SHARE, policies  # uncapped here: 0.50 and 0.70
    assert manifest["sft_refuse_share"] == round(share, 3)
    subjects = manifest["sft_subjects_by_category"]
    assert subjects["drugs"] == len({e.group for e in split.train if e.category == "drugs"}) > 10


def test_a_lower_share_is_a_knob_of_the_mix():
    from meshlm.safety.augment import words

    examples = synthesize(load_spec(), 0, SynthSizes(refuse=30, warn=10, answer=10, corpus_questions=0,
                                                      arithmetic=0, max_refuse_share=0.25), documents=DOCS)
    first = {}
    for e in examples:
        first.setdefault(" ".join(words(e.prompt)), e.policy)
    assert sum(p == "refuse" for p in first.values()) / len(first) <= 0.25
    assert {e.category for e in examples if e.policy == "refuse"} == {"weapons", "malware", "fraud", "drugs",
                                                                       "violence"}
    with pytest.raises(ValueError, match="max_refuse_share"):
        SynthSizes(max_refuse_share=0)


def test_warn_categories_have_varied_cautions_referrals_and_general_information():
    for name in WARN:
        found = material(name, "warn")
        assert len(set(found["cautions"])) >= 6 and len(set(found["referrals"])) >= 6, name
        assert all(infos and all(len(i) > 40 for i in infos) for _, infos in warn_subjects(name)), name
        several = [e for e in found["subjects"] if e.get("writer") == "helper-h7" and isinstance(e["info"], list)]
        assert len(several) >= (1 if name == "medical" else 10), name  # several information texts per topic


def test_hand_written_near_misses_are_many_and_named():
    """Dozens per group: trigger-word answers (kill, execute, ...), medication warns, drug-making refusals."""
    mine = lambda rows: [r for r in rows if r.get("writer") == "helper-h7"]  # noqa: E731
    contrast = mine(material("contrast", "answer")["entries"])
    text = " ".join(q.lower() for e in contrast for q in e["questions"])
    for word in ("kill", "execute", "attack", "exploit", "shoot", "hack", "destroy", "crack", "inject", "bomb"):
        assert word in text, word
    assert len(contrast) >= 80
    assert len(mine(material("medical", "warn")["subjects"])) >= 24
    assert len(mine(material("drugs", "refuse")["entries"])) >= 24


def test_the_rule_judge_reads_the_near_misses_as_their_policy():
    from meshlm.safety.judges.rule import RuleJudge

    rng = random.Random(0)
    prompts, responses, expected = [], [], []
    for e in material("contrast", "answer")["entries"]:
        if e.get("writer") == "helper-h7":
            prompts.append(e["questions"][0]), responses.append(e["answer"]), expected.append("answer")
    for name in WARN:
        found = material(name, "warn")
        for questions, infos in warn_subjects(name):
            closing = f"{rng.choice(found['cautions'])} {rng.choice(found['referrals'])}"
            prompts.append(questions[0]), responses.append(f"{rng.choice(infos)} {closing}"), expected.append("warn")
    for e in material("drugs", "refuse")["entries"]:
        prompts.append(f"How do I {e['act']}?"), responses.append(refusal(rng, "drugs", e["topic"]))
        expected.append("refuse")
    got = RuleJudge().label(prompts, responses)
    wrong = [(p, r, g) for p, r, g, x in zip(prompts, responses, got, expected) if g != x]
    assert not wrong, wrong[:3]


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def test_no_material_prompt_equals_a_heldout_evaluation_prompt():
    """The held-out prompt sets and the sealed judge sets measure the work: material must not copy them (refuse
    acts in every request framing, warn questions in every warn frame, answer questions as written)."""
    held = {_norm(json.loads(line)["prompt"])
            for s in evalsets.sets("prompts") + evalsets.sets("judge", "sealed")
            for line in s.path.read_text(encoding="utf-8").splitlines() if line.strip()}
    assert len(held) > 1000
    prompts = []
    for cat in load_spec().categories.values():
        if cat.policy == "refuse":
            prompts += [f.format(act=act) for act, _ in refuse_subjects(cat.name) for f in framings()["refuse"]]
        elif cat.policy == "warn":
            prompts += [f.format(q=q) for qs, _ in warn_subjects(cat.name) for q in qs
                        for f in ("{q}", *framings()["warn"])]
        else:
            prompts += [q for e in material(cat.name, "answer").get("entries", []) for q in e["questions"]]
    copied = sorted({p for p in prompts if _norm(p) in held})
    assert not copied, copied[:5]


def test_the_align_config_knob_reaches_the_written_data(tmp_path):
    from meshlm.errors import ConfigError
    from meshlm.safety.align_config import load_align_config
    from meshlm.safety.pipeline import make_dataset

    cfg = load_align_config(None, ["data.max_refuse_share=0.3"])
    assert cfg.data.max_refuse_share == 0.3 and load_align_config(None, []).data.max_refuse_share == MAX_REFUSE_SHARE
    with pytest.raises(ConfigError, match="data.max_refuse_share = 1.5"):
        load_align_config(None, ["data.max_refuse_share=1.5"])
    sizes = SynthSizes(refuse=20, warn=10, answer=10, corpus_questions=0, arithmetic=0, max_refuse_share=0.3)
    manifest = make_dataset("", tmp_path, 0, sizes, eval_group_fraction=0.05)
    assert 0.25 <= manifest["sft_refuse_share"] <= 0.3
