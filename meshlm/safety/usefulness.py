"""Factual accuracy: does an aligned model still answer plain questions? (``meshlm eval facts``)

Alignment that teaches refusals can also teach a model to refuse, hedge or forget; the safety rates alone do not
show it. This evaluation asks short general-knowledge questions (``meshlm/safety/data/factual_qa.jsonl``, written
apart from the spec's data) through the same batched, greedy chat generation as the safety evaluation
(:class:`meshlm.safety.generation.CheckpointGenerator`, the checkpoint's own template) and scores each response
by its accepted answers: correct when the response contains one of them as a whole word or phrase, ignoring case
(numbers as the file lists them: "4" and "four" are two accepted answers, and "4" does not match "40" or "4.5").
Accuracy carries a Wilson 95% interval (:func:`meshlm.safety.metrics.rate`), overall and per topic.

    rows = read_questions()                             # the embedded file
    report = evaluate_facts(rows, checkpoint_generator("runs/dpo", max_new_tokens=48))
    write_fact_outputs(report, "out/")                  # responses.jsonl, report.json, report.md
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from meshlm.data.jsonl import iter_jsonl
from meshlm.errors import DataError
from meshlm.safety.metrics import rate

FACTS_FILE = Path(__file__).parent / "data" / "factual_qa.jsonl"
Generate = Callable[[list[str]], list[str]]


def read_questions(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows ``{"id", "question", "answers": [str, ...], "topic"?}`` (the embedded file when ``path`` is None)."""
    path = path or FACTS_FILE
    rows = [_check_row(row, where) for where, row in
            iter_jsonl(path, "a JSONL file of {id, question, answers} rows (the factual questions file)")]
    if not rows:
        raise DataError(f"factual questions file {path} has no rows")
    return rows


def _check_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object with question and answers")
    if not isinstance(row.get("question"), str) or not row["question"].strip():
        raise DataError(f"{where}: 'question' must be a non-empty string")
    answers = row.get("answers")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise DataError(f"{where}: 'answers' must be a non-empty list of non-empty strings (the accepted answers)")
    if row.get("topic") is not None and not isinstance(row["topic"], str):
        raise DataError(f"{where}: 'topic' must be a string when given")
    return row


def _answer_pattern(answer: str) -> re.Pattern[str]:
    """``answer`` as a whole word or phrase: no letter or digit on either side, any run of spaces between its
    words, and a number not continued by a decimal or thousands part ("4" is not found in "4.5" or "4,000")."""
    words = [re.escape(w) for w in answer.split()]
    tail = r"(?![.,]\d)" if answer.strip()[-1].isdigit() else ""
    lead = r"(?<!\d[.,])" if answer.strip()[0].isdigit() else ""
    body = r"\s+".join(words)
    return re.compile(rf"(?<!\w){lead}{body}(?!\w){tail}", re.IGNORECASE)


def matched_answer(response: str, answers: Sequence[str]) -> str | None:
    """The first accepted answer ``response`` contains as a whole word or phrase (case-insensitive), or None."""
    for answer in answers:
        if _answer_pattern(answer).search(response):
            return answer
    return None


def evaluate_facts(rows: Sequence[Mapping[str, Any]], generate: Generate, *, batch_size: int = 32,
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Ask every question, score the responses; the report has ``accuracy`` ({rate, n, k, ci95}),
    ``by_topic``, ``records`` (one per question: id, question, answers, response, matched, correct) and what
    generating cost: ``generate_s``, ``new_tokens`` and ``tokens_per_s`` (None where the generator cannot count
    its tokens), and the ``generation`` block of :func:`meshlm.safety.generation.generation_stats`."""
    from meshlm.safety.generation import Measured

    rows = [_check_row(dict(r), f"row {i}") for i, r in enumerate(rows)]
    questions = [r["question"] for r in rows]
    responses: list[str] = []
    generate, start = Measured(generate), time.perf_counter()
    for begin in range(0, len(questions), batch_size):
        batch = questions[begin:begin + batch_size]
        out = generate(batch)
        if len(out) != len(batch):
            raise RuntimeError(f"generate returned {len(out)} responses for {len(batch)} questions")
        responses += [str(x) for x in out]
        if progress:
            progress(f"answered {len(responses)}/{len(questions)}")
    records = []
    for row, response in zip(rows, responses):
        match = matched_answer(response, row["answers"])
        records.append({"id": row.get("id"), "question": row["question"], "answers": row["answers"],
                        "topic": row.get("topic"), "response": response, "matched": match,
                        "correct": match is not None})
    generation = generate.stats()
    return {**summarize_facts(records), "generate_s": round(time.perf_counter() - start, 2),
            "new_tokens": generation["new_tokens"], "tokens_per_s": generation["tokens_per_s"],
            "generation": generation, "records": records}


def summarize_facts(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Accuracy with its Wilson 95% interval, overall and per topic (topics in first-seen order)."""
    topics: dict[str, list[bool]] = {}
    for r in records:
        topics.setdefault(r.get("topic") or "other", []).append(bool(r["correct"]))
    return {"n": len(records), "accuracy": rate(sum(bool(r["correct"]) for r in records), len(records)),
            "by_topic": {t: rate(sum(hits), len(hits)) for t, hits in topics.items()}}


def _fmt(stat: Mapping[str, Any]) -> str:
    if not stat.get("n"):
        return "–"
    lo, hi = stat["ci95"]
    return f"{stat['rate']:.3f} [{lo:.3f}, {hi:.3f}] ({stat['k']}/{stat['n']})"


def report_markdown(report: Mapping[str, Any]) -> str:
    from meshlm.safety.evaluate import generation_markdown

    lines = ["# Factual accuracy\n", f"source: `{report.get('source', '?')}`, questions: {report['n']}; correct = "
             "the response contains an accepted answer as a whole word (case-insensitive); Wilson 95% intervals.\n",
             f"**accuracy: {_fmt(report['accuracy'])}**\n", "| topic | accuracy |", "|---|---|"]
    lines += [f"| {topic} | {_fmt(stat)} |" for topic, stat in report["by_topic"].items()]
    return "\n".join(lines + generation_markdown(report.get("generation"))) + "\n"


def write_fact_outputs(report: Mapping[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """DIR/responses.jsonl (the records), DIR/report.json (the report without records), DIR/report.md."""
    from meshlm.safety.evaluate import write_outputs

    return write_outputs(report, out_dir, markdown=report_markdown)


# ---- in the align pipeline (meshlm/safety/pipeline.py) --------------------------------------------------------
def evaluate_checkpoint_facts(name: str, checkpoint: str | Path, questions: str, out: Path, *,
                              max_new_tokens: int, batch_size: int, resume: bool = False,
                              log: Callable[[str], None] = print, generate: Generate | None = None) -> dict[str, Any]:
    """Factual accuracy of one pipeline model, written to ``out/<name>/facts/``; with ``resume`` a report for the
    same questions is reused. ``questions``: a JSONL path, empty for the embedded file. ``generate``: the
    checkpoint's generator to ask (the pipeline's, through its cache; built here when None)."""
    from meshlm.safety.evaluate import checkpoint_generator

    rows = read_questions(questions or None)
    folder = out / name / "facts"
    done = folder / "report.json"
    if resume and done.is_file() and _same_questions(folder / "responses.jsonl", rows):
        log(f"facts {name}: reused {done}")
        return json.loads(done.read_text())
    generate = generate or checkpoint_generator(checkpoint, max_new_tokens=max_new_tokens)
    report = {"source": str(checkpoint), **evaluate_facts(rows, generate, batch_size=batch_size)}
    write_fact_outputs(report, folder)
    log(f"facts {name}: accuracy {report['accuracy']['rate']:.3f} on {len(rows)} questions in "
        f"{report['generate_s']:.0f} s")
    return {k: v for k, v in report.items() if k != "records"}


def _same_questions(responses: Path, rows: Sequence[Mapping[str, Any]]) -> bool:
    if not responses.is_file():
        return False
    done = [json.loads(line)["question"] for line in responses.read_text(encoding="utf-8").splitlines() if line]
    return done == [r["question"] for r in rows]


def facts_vs_base(facts: Mapping[str, Mapping[str, Any]], final: str, max_drop: float) -> dict[str, Any] | None:
    """The usefulness target: the final model's accuracy at most ``max_drop`` below the base's (None without a
    base measurement)."""
    if "base" not in facts or final not in facts:
        return None
    base, last = facts["base"]["accuracy"]["rate"], facts[final]["accuracy"]["rate"]
    drop = base - last
    return {"base": base, final: last, "drop": round(drop, 6), "max_drop": max_drop,
            "passed": drop <= max_drop + 1e-12}


def facts_markdown(report: Mapping[str, Any]) -> list[str]:
    """The align report's section: accuracy of each model side by side, and the usefulness target."""
    facts = report.get("facts") or {}
    if not facts:
        return []
    lines = [f"## Factual accuracy ({next(iter(facts.values()))['n']} questions)", "",
             "| model | accuracy [95% CI] | correct |", "|---|---|---|"]
    for model, r in facts.items():
        acc = r["accuracy"]
        lines.append(f"| {model} | {acc['rate']:.3f} [{acc['ci95'][0]:.2f}, {acc['ci95'][1]:.2f}] | "
                     f"{acc['k']}/{acc['n']} |")
    check = report.get("facts_vs_base")
    if check:
        lines += ["", f"Usefulness target (final model at most {check['max_drop']:.2f} below the base): drop "
                  f"{check['drop']:+.3f}, {'pass' if check['passed'] else 'FAIL'}."]
    return lines + [""]
