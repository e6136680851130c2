"""Factual accuracy (meshlm/safety/usefulness.py, ``meshlm eval facts``): the whole-word scorer on constructed
responses, the report's Wilson interval by hand, the shipped question file, bad input, and the CLI end to end on
a real tiny checkpoint (its text is noise, so no accuracy is asserted beyond what the records imply)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_eval_safety import counted_new_tokens

from meshlm.errors import DataError
from meshlm.safety.metrics import wilson
from meshlm.safety.usefulness import (FACTS_FILE, evaluate_facts, matched_answer, read_questions, summarize_facts,
                                      write_fact_outputs)


@pytest.mark.parametrize("response, answers, expected", [
    ("The capital of France is Paris.", ["Paris"], "Paris"),
    ("paris", ["Paris"], "Paris"),                                  # case-insensitive
    ("Parisian cafés are famous.", ["Paris"], None),                # a word, not a substring
    ("There are 40 of them.", ["4", "four"], None),                 # 4 is not 40
    ("About 4.5 on average.", ["4", "four"], None),                 # nor the integer part of a decimal
    ("Roughly 4,000 years.", ["4", "four"], None),                  # nor of a thousands figure
    ("It was 1.4 m tall.", ["4"], None),                            # nor a decimal's fraction
    ("A heart has four chambers.", ["4", "four"], "four"),          # numbers as words, as the file lists them
    ("It has 4 chambers.", ["4", "four"], "4"),
    ("Painted by Vincent  van\ngogh in 1889.", ["Van Gogh"], "Van Gogh"),  # any whitespace between words
    ("365.25 days", ["365", "365.25"], "365.25"),
    ("The symbol is Au.", ["Au"], "Au"),
    ("An aurora over the sea.", ["Au"], None),
    ("Its formula is H₂O.", ["H2O", "H₂O"], "H₂O"),
    ("", ["Paris"], None),
])
def test_scorer_matches_whole_words_only(response, answers, expected):
    assert matched_answer(response, answers) == expected


ROWS = [{"id": "q1", "question": "Capital of France?", "answers": ["Paris"], "topic": "geography"},
        {"id": "q2", "question": "Capital of Japan?", "answers": ["Tokyo"], "topic": "geography"},
        {"id": "q3", "question": "Chambers of the heart?", "answers": ["4", "four"], "topic": "body"},
        {"id": "q4", "question": "Symbol for gold?", "answers": ["Au"], "topic": "science"},
        {"id": "q5", "question": "Largest planet?", "answers": ["Jupiter"], "topic": "science"}]
SAID = {"Capital of France?": "It is Paris.", "Capital of Japan?": "I can't help with that.",
        "Chambers of the heart?": "Four.", "Symbol for gold?": "Ag", "Largest planet?": "Jupiter, by far."}


def test_report_counts_topics_and_wilson_interval_by_hand(tmp_path):
    calls: list[int] = []

    def scripted(questions: list[str]) -> list[str]:
        calls.append(len(questions))
        return [SAID[q] for q in questions]

    report = evaluate_facts(ROWS, scripted, batch_size=2)
    assert calls == [2, 2, 1]                                     # batched as asked
    acc = report["accuracy"]
    assert (acc["k"], acc["n"], acc["rate"]) == (3, 5, 0.6)
    assert acc["ci95"] == pytest.approx(list(wilson(3, 5)), abs=1e-6)  # the metrics helper's interval
    assert {t: (s["k"], s["n"]) for t, s in report["by_topic"].items()} == \
        {"geography": (1, 2), "body": (1, 1), "science": (1, 2)}
    assert [r["correct"] for r in report["records"]] == [True, False, True, False, True]
    assert report["records"][2]["matched"] == "four"
    paths = write_fact_outputs(report, tmp_path / "out")
    lines = [json.loads(x) for x in paths["responses"].read_text().splitlines()]
    assert [r["response"] for r in lines] == [SAID[r["question"]] for r in ROWS]
    body = json.loads(paths["report"].read_text())
    assert "records" not in body and body["accuracy"] == acc
    assert summarize_facts(lines)["accuracy"] == acc             # the records alone reproduce the figure
    assert "0.600" in paths["markdown"].read_text()


def test_shipped_question_file_is_valid():
    rows = read_questions()
    assert len(rows) >= 100                                       # issue 19: at least 100 short questions
    assert len({r["id"] for r in rows}) == len(rows)
    assert len({r["question"].strip().lower() for r in rows}) == len(rows)
    assert FACTS_FILE.is_file()


@pytest.mark.parametrize("line, message", [
    ('{"question": "Q?"}', "'answers' must be a non-empty list"),
    ('{"question": "Q?", "answers": []}', "'answers' must be a non-empty list"),
    ('{"question": " ", "answers": ["a"]}', "'question' must be a non-empty string"),
    ('["Q?", "a"]', "expected a JSON object"),
])
def test_bad_question_rows_name_the_line(tmp_path, line, message):
    path = tmp_path / "q.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(DataError, match=message) as exc:
        read_questions(path)
    assert "q.jsonl" in str(exc.value)


def _cli(capfd, *args: str) -> tuple[int, str, str]:
    from meshlm.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capfd.readouterr()
    return exc.value.code, out, err


def test_cli_end_to_end_on_a_tiny_checkpoint(tiny_run: Path, tmp_path, capfd):
    from meshlm.safety.evaluate import checkpoint_generator

    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    code, stdout, _ = _cli(capfd, "eval", "facts", "--checkpoint", str(tiny_run), "--questions", str(questions),
                           "--out", str(tmp_path / "o"), "--max-new-tokens", "4", "--batch-size", "2", "--json")
    assert code == 0
    report = json.loads(stdout)
    records = [json.loads(x) for x in (tmp_path / "o" / "responses.jsonl").read_text().splitlines()]
    # the same greedy, batched chat generation as the safety evaluation
    generate = checkpoint_generator(tiny_run, max_new_tokens=4)
    assert [r["response"] for r in records] == generate([r["question"] for r in ROWS])
    # what generating cost, beside generate_s: the response tokens the rollout decoded, and tokens/s
    assert report["new_tokens"] == report["generation"]["new_tokens"] == counted_new_tokens(
        generate, [r["question"] for r in ROWS]) > 0
    assert report["generation"]["prompts"] == 5 and report["tokens_per_s"] > 0
    assert report["n"] == 5 and report["accuracy"]["k"] == sum(
        matched_answer(r["response"], r["answers"]) is not None for r in records)
    code, _, err = _cli(capfd, "eval", "facts", "--checkpoint", str(tiny_run), "--questions",
                        str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x"))
    assert code == 2 and "missing.jsonl" in err and "Traceback" not in err
    code, _, err = _cli(capfd, "eval", "facts", "--checkpoint", str(tiny_run), "--out", str(tmp_path / "x"),
                        "--limit", "0")
    assert code == 2 and "--limit" in err


def test_shipped_smollm2_align_config_loads_with_the_usefulness_target():
    from meshlm.safety.align_config import DEFAULT_CONFIG, load_align_config

    cfg = load_align_config(DEFAULT_CONFIG.parent / "align-smollm2.toml", ['base.checkpoint="runs/smol"'])
    assert cfg.base.checkpoint == "runs/smol" and cfg.eval.facts == "" and cfg.eval.facts_max_drop == 0.03
    assert cfg.sft.lr <= 1e-4 and cfg.dpo.enabled  # fine-tuning rates for a pretrained model, DPO on
