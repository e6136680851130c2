"""SFT targets in the base model's own words for the prompts it already handles well.

Template answers are short and uniform: fine-tuning a pretrained chat model on them moves what it says to every
safe prompt (shorter, flatter answers, facts it knew replaced by the template's style) while it learns to refuse.
With ``sft.answer_targets = "base"`` the base model answers the SFT set's single-turn ``answer`` and ``warn``
prompts first (greedy, the evaluation's budget; direct prompts only: a safe question inside an attack framing keeps
its template, which teaches answering through the framing), and

- an ``answer`` row takes the base's answer as its target when the judge labels it ``answer`` (not a refusal,
  not a referral, not degenerate text) and it is no deflection ("as a chatbot, I don't have the ability to ..."),
  cut to its last complete sentence;
- a ``warn`` row takes the base's answer (its first sentences) with a caution and a referral of the category
  (:func:`meshlm.safety.synth.warn_answer`: after the answer, or with ``data.warn_referral = "first"`` the referral
  before it) when the base's answer alone is labelled ``answer`` and the whole is labelled ``warn``.

With ``warn_targets = "template"`` the warn rows are not asked and keep their synthesised text: on SmolLM2 most
of the base's accepted warn "information" was a deflection ("as a chatbot designed to assist with ..., I'm not
equipped"), sympathy, a counter-question or wrong doses, which the judge reads as an answer (docs/safety.md,
session 13).

Every other row (refuse rows, multi-turn rows, prompts the base refused or looped on) keeps its template target.
On safe prompts the fine-tune then mostly sees text it already assigns high probability, so the update is
spent on what it has to learn: the refusals and the referrals.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Callable

from meshlm.data.jsonl import iter_jsonl
from meshlm.fileio import atomic_write_text
from meshlm.safety.synth import warn_answer

Generate = Callable[[list[str]], list[str]]
Label = Callable[[list[str], list[str]], list[str]]  # a judge's batched label(prompts, responses)
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")
# A deflection the judges read as an answer ("as a chatbot, I don't have the ability to ..."): never a target.
_DEFLECTION = re.compile(r"\b(?:as an? (?:ai|chatbot|language model|assistant|virtual assistant)\b[^.]{0,60}?\bi\b"
                         r"[^.]{0,20}?\b(?:don't|do not|can't|cannot|am not able|am unable)|i (?:don't|do not) have "
                         r"the (?:ability|capability|capacity)|i'm not able to|i am not able to)", re.IGNORECASE)
_WARN_INFO_CHARS = 320  # the base's information in a warn target: its first sentences up to this length


def complete_sentences(text: str, max_chars: int | None = None) -> str:
    """``text`` cut after its last complete sentence (and, with ``max_chars``, after the last one that ends within
    it; the first sentence is kept whole); "" when no sentence is complete."""
    text = text.strip()
    ends = [m.start() for m in _SENTENCE_END.finditer(text + " ")]
    if not ends:
        return ""
    fits = [e for e in ends if max_chars is None or e <= max_chars] or ends[:1]
    return text[:fits[-1]].strip()


def self_distill(rows: list[dict], generate: Generate, label: Label, *, limit: int = 0, seed: int = 0,
                 batch_size: int = 32, warn_targets: str = "base",
                 warn_referral: str = "last") -> tuple[list[dict], dict]:
    """``rows`` with base-model targets where they pass (module docstring); ``limit`` > 0 answers at most that
    many prompts of each policy (the others keep their templates); ``warn_targets = "template"`` asks no warn
    prompt; ``warn_referral`` places a warn target's referral (:func:`meshlm.safety.synth.warn_answer`). Returns
    (rows, counts)."""
    rng = random.Random(f"self-distill:{seed}")
    picked = {"answer": [], "warn": []} if warn_targets == "base" else {"answer": []}
    for i, row in enumerate(rows):
        roles = [m["role"] for m in row["messages"]]
        if row.get("policy") in picked and roles == ["user", "assistant"] and row.get("family", "direct") == "direct":
            picked[row["policy"]].append(i)
    for policy, index in picked.items():
        if limit and len(index) > limit:
            picked[policy] = sorted(rng.sample(index, limit))
    todo = sorted(i for index in picked.values() for i in index)
    prompts = [rows[i]["messages"][0]["content"] for i in todo]
    answers: list[str] = []
    for start in range(0, len(prompts), batch_size):
        answers += generate(prompts[start:start + batch_size])
    targets, infos = [], []
    for i, answer in zip(todo, answers):
        if rows[i]["policy"] == "answer":
            targets.append(complete_sentences(answer))
            infos.append("")
        else:
            info = complete_sentences(answer, _WARN_INFO_CHARS)
            infos.append(info)
            targets.append(warn_answer(rng, rows[i]["category"], info, warn_referral) if info else "")
    target_labels = label(prompts, targets)
    info_labels = label(prompts, infos)
    out = list(rows)
    counts = {"answer_asked": len(picked["answer"]), "answer_kept": 0, "warn_asked": len(picked.get("warn", [])),
              "warn_kept": 0}
    for i, target, info, lab, info_lab in zip(todo, targets, infos, target_labels, info_labels):
        policy = rows[i]["policy"]
        keep = bool(target) and not _DEFLECTION.search(target) and \
            (lab == "answer" if policy == "answer" else info_lab == "answer" and lab == "warn")
        if keep:
            out[i] = {**rows[i], "messages": [rows[i]["messages"][0], {"role": "assistant", "content": target}],
                      "target": "base"}
            counts[f"{policy}_kept"] += 1
    return out, counts


def write_self_distilled(data: Path, out: Path, generate: Generate, label: Label, *, limit: int, seed: int,
                         batch_size: int, warn_targets: str = "base", warn_referral: str = "last") -> dict:
    """``out``: ``data/sft.jsonl`` with :func:`self_distill`'s targets; returns its counts."""
    rows = [row for _, row in iter_jsonl(data / "sft.jsonl", "the rows `meshlm align data` wrote")]
    new, counts = self_distill(rows, generate, label, limit=limit, seed=seed, batch_size=batch_size,
                               warn_targets=warn_targets, warn_referral=warn_referral)
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in new))
    return counts
