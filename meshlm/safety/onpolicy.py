"""On-policy preference pairs: the SFT model's own wrong responses as the rejected side.

Hand-written rejections (placeholder compliance, another policy's template) are responses the tuned model rarely
produces, so their pairs saturate at once and the pairs that do move the model are those that push down what it
*does* say — mostly refusals, on answer prompts. Pairing the spec's response with what the SFT model actually
answered on a training prompt (when the rule judge gives it another label than the policy) puts the pressure
where the model errs, in both directions: a refusal over its own compliance on a harmful prompt, an answer over
its own needless refusal on a safe one. Only training prompts are used, so the split stays leak-free.

Which training prompts are asked: most of them make no pair (a fine-tuned model rarely errs on the prompts it was
tuned on; on refuse prompts almost never), so a uniform draw spends its generation on prompts that cannot teach.
The draw is in two steps (:func:`sample_prompts`): a uniform pilot of a quarter of the budget, answered and
judged; then the rest of the budget drawn without replacement with each row weighted by its stratum's pilot
yield — the share of the pilot's rows of the same policy and category that made a pair DPO keeps (not in
``exclude``), shrunk toward the pilot's overall yield by one pseudo-row. The strata where the SFT model errs (a
contrast or answer category it refuses, a warn category it answers without the referral) are asked most; refuse
categories, where it almost never errs, least — never none, as a stratum the pilot missed keeps the overall yield.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable

from meshlm.data.jsonl import iter_jsonl
from meshlm.fileio import atomic_write_text
from meshlm.safety.spec import Spec

Generate = Callable[[list[str]], list[str]]
Label = Callable[[list[str], list[str]], list[str]]
PILOT_SHARE = 0.25  # of the on-policy budget, drawn uniformly to measure each stratum's yield


def on_policy_pairs(sft_rows: list[dict], generate: Generate, label: Label, *, batch_size: int = 48) -> list[dict]:
    """Preference rows (the ``preference.jsonl`` schema) for the ``sft_rows`` whose generated response the judge
    labels differently from the row's policy; ``chosen`` is the row's own (spec) response."""
    prompts = [r["messages"][0]["content"] for r in sft_rows]
    responses: list[str] = []
    for start in range(0, len(prompts), batch_size):
        responses += generate(prompts[start:start + batch_size])
    labels = label(prompts, responses)
    pairs = []
    for row, response, got in zip(sft_rows, responses, labels):
        if got == row["policy"] or not response.strip():
            continue
        pairs.append({"prompt": [row["messages"][0]], "chosen": [row["messages"][1]],
                      "rejected": [{"role": "assistant", "content": response}], "category": row["category"],
                      "chosen_label": row["policy"], "rejected_label": got, "family": row.get("family", "direct"),
                      "on_policy": True})
    return pairs


def probe_rows(spec: Spec, eval_groups: list[str], avoid: list[str], n: int, seed: int) -> list[dict]:
    """``n`` SFT-schema rows asking for *training* refuse subjects in phrasings SFT never used (the probe
    framings, half of them inside an attack frame), each with the spec's refusal. Subjects of ``eval_groups``
    are skipped and any prompt that nearly duplicates one of ``avoid`` (evaluation prompts) is dropped, so the
    split stays leak-free. On training prompts the SFT model almost never complies; here it sometimes does, and
    those compliances are the rejected sides that keep DPO from only pushing refusals down."""
    from meshlm.safety.augment import FAMILIES, paraphrase, wrap_attack
    from meshlm.safety.material import framings
    from meshlm.safety.datasets import NearDuplicateIndex, normalize
    from meshlm.safety.synth import refusal, refuse_subjects

    rng = random.Random(f"probe:{seed}")
    held = set(eval_groups)
    subjects = [(cat.name, s, act, topic) for cat in spec.by_policy("refuse")
                for s, (act, topic) in enumerate(refuse_subjects(cat.name)) if f"{cat.name}:{s}" not in held]
    if not subjects or n <= 0:
        return []
    index, seen, rows = NearDuplicateIndex(avoid), set(), []
    for _ in range(4 * n):
        if len(rows) >= n:
            break
        category, s, act, topic = rng.choice(subjects)
        prompt, family = paraphrase(rng.choice(framings()["probe"]).format(act=act), rng), "direct"
        if rng.random() < 0.5:
            family = rng.choice(FAMILIES)
            prompt = wrap_attack(prompt, family, rng, act=act)
        key = normalize(prompt)
        if key in seen or index.matches(prompt):
            continue
        seen.add(key)
        rows.append({"messages": [{"role": "user", "content": prompt},
                                  {"role": "assistant", "content": refusal(rng, category, topic)}],
                     "category": category, "policy": "refuse", "family": family, "group": f"{category}:{s}"})
    return rows


def write_on_policy_preferences(data: Path, out: Path, generate: Generate, label: Label, *, prompts: int,
                                offline: int, seed: int, batch_size: int = 48, probes: list[dict] = (),
                                exclude: tuple[str, ...] = (), warn_repeat: int = 1, answer_repeat: int = 1,
                                refuse_repeat: int = 1) -> dict:
    """``out``: the on-policy pairs of ``prompts`` sampled training prompts and of the ``probes`` (see
    :func:`probe_rows`), plus ``offline`` sampled rows of ``data/preference.jsonl`` (so every label pair stays
    represented); on-policy pairs whose ``chosen>rejected`` labels are in ``exclude`` are counted but not
    written; every pair whose chosen side is a warn is written ``warn_repeat`` times (DPO presents it that much
    more often: on SmolLM2 they were a quarter of the pairs and DPO turned warns into refusals), and likewise
    every pair whose chosen side is an answer ``answer_repeat`` times and a refusal ``refuse_repeat`` times (the
    mix of chosen labels decides the refuse / warn / answer trade-off DPO makes). Returns counts for the report."""
    rng = random.Random(f"on-policy:{seed}")
    sft = _rows(data / "sft.jsonl")
    pairs, draw = sample_prompts(sft, prompts, generate, label, rng, batch_size=batch_size, exclude=exclude)
    probe_pairs = on_policy_pairs(list(probes), generate, label, batch_size=batch_size) if probes else []
    for p in probe_pairs:
        p["probe"] = True
    found = _by_labels(pairs)
    pairs = [p for p in pairs if _label_pair(p) not in exclude]
    pref = _rows(data / "preference.jsonl")
    mixed = pairs + probe_pairs + rng.sample(pref, min(offline, len(pref)))
    n_distinct = len(mixed)
    repeat = {"warn": warn_repeat, "answer": answer_repeat, "refuse": refuse_repeat}
    chosen = {label: sum(p["chosen_label"] == label for p in mixed) for label in repeat}
    mixed += [p for p in mixed for _ in range(repeat.get(p["chosen_label"], 1) - 1)]
    rng.shuffle(mixed)
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in mixed))
    return {"prompts": min(prompts, len(sft)), "draw": draw, "on_policy_pairs": len(pairs),
            "on_policy_by_labels": found,
            "excluded": sorted(exclude),
            "probe_prompts": len(probes), "probe_pairs": len(probe_pairs),
            "probe_by_family": _by(probe_pairs, lambda p: p["family"]),
            "offline_pairs": n_distinct - len(pairs) - len(probe_pairs),
            "warn_chosen_pairs": chosen["warn"], "warn_pair_repeat": warn_repeat,
            "answer_chosen_pairs": chosen["answer"], "answer_pair_repeat": answer_repeat,
            "refuse_chosen_pairs": chosen["refuse"], "refuse_pair_repeat": refuse_repeat,
            "pairs_written": len(mixed), "written_by_chosen": _by(mixed, lambda p: p["chosen_label"])}


def _stratum(policy: str, category: str) -> str:
    return f"{policy}/{category}"


def sample_prompts(sft: list[dict], prompts: int, generate: Generate, label: Label, rng: random.Random, *,
                   batch_size: int, exclude: tuple[str, ...] = ()) -> tuple[list[dict], dict]:
    """On-policy pairs of ``prompts`` training rows drawn as the module docstring says (all rows when the budget
    covers them); returns (pairs, the draw's counts: prompts and kept pairs of the pilot and of the weighted
    draw, and the prompts asked per policy)."""
    n = min(prompts, len(sft))
    if n == len(sft):
        picked = rng.sample(sft, n)
        pairs = on_policy_pairs(picked, generate, label, batch_size=batch_size) if picked else []
        return pairs, {"rule": "all", "asked_by_policy": _by(picked, lambda r: r["policy"])}
    order = rng.sample(range(len(sft)), len(sft))
    n_pilot = max(1, round(n * PILOT_SHARE))
    pilot = [sft[i] for i in order[:n_pilot]]
    pilot_pairs = on_policy_pairs(pilot, generate, label, batch_size=batch_size)
    kept = _by([p for p in pilot_pairs if _label_pair(p) not in exclude],
               lambda p: _stratum(p["chosen_label"], p["category"]))
    asked = _by(pilot, lambda r: _stratum(r["policy"], r["category"]))
    overall = sum(kept.values()) / len(pilot)
    weight = {s: (kept.get(s, 0) + overall) / (k + 1) for s, k in asked.items()}  # one pseudo-row at `overall`
    pool = order[n_pilot:]
    # Weighted sampling without replacement (Efraimidis-Spirakis): the n - n_pilot largest u ** (1 / w).
    keys = [rng.random() ** (1 / max(weight.get(_stratum(sft[i]["policy"], sft[i]["category"]), overall), 1e-9))
            for i in pool]
    chosen = [pool[j] for j in sorted(range(len(pool)), key=keys.__getitem__, reverse=True)[:n - n_pilot]]
    rest = [sft[i] for i in sorted(chosen)]
    rest_pairs = on_policy_pairs(rest, generate, label, batch_size=batch_size)
    return pilot_pairs + rest_pairs, {
        "rule": "pilot+yield-weighted", "pilot_prompts": len(pilot), "pilot_pairs_kept": sum(kept.values()),
        "weighted_prompts": len(rest), "weighted_pairs_kept": sum(_label_pair(p) not in exclude for p in rest_pairs),
        "asked_by_policy": _by(pilot + rest, lambda r: r["policy"])}


def _label_pair(pair: dict) -> str:
    return f"{pair['chosen_label']}>{pair['rejected_label']}"


def _by_labels(pairs: list[dict]) -> dict[str, int]:
    return _by(pairs, _label_pair)


def _by(pairs: list[dict], key: Callable[[dict], str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in pairs:
        out[key(p)] = out.get(key(p), 0) + 1
    return dict(sorted(out.items()))


def _rows(path: Path) -> list[dict]:
    return [row for _, row in iter_jsonl(path, "the rows `meshlm align data` wrote")]
