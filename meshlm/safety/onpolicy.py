"""On-policy preference pairs: the SFT model's own wrong responses as the rejected side.

Hand-written rejections (placeholder compliance, another policy's template) are responses the tuned model rarely
produces, so their pairs saturate at once and the pairs that do move the model are those that push down what it
*does* say — mostly refusals, on answer prompts. Pairing the spec's response with what the SFT model actually
answered on a training prompt (when the rule judge gives it another label than the policy) puts the pressure
where the model errs, in both directions: a refusal over its own compliance on a harmful prompt, an answer over
its own needless refusal on a safe one. Only training prompts are used, so the split stays leak-free.
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
                                exclude: tuple[str, ...] = ()) -> dict:
    """``out``: the on-policy pairs of ``prompts`` sampled training prompts and of the ``probes`` (see
    :func:`probe_rows`), plus ``offline`` sampled rows of ``data/preference.jsonl`` (so every label pair stays
    represented); on-policy pairs whose ``chosen>rejected`` labels are in ``exclude`` are counted but not
    written. Returns counts for the report."""
    rng = random.Random(f"on-policy:{seed}")
    sft = _rows(data / "sft.jsonl")
    sampled = rng.sample(sft, min(prompts, len(sft)))
    pairs = on_policy_pairs(sampled, generate, label, batch_size=batch_size) if sampled else []
    probe_pairs = on_policy_pairs(list(probes), generate, label, batch_size=batch_size) if probes else []
    for p in probe_pairs:
        p["probe"] = True
    found = _by_labels(pairs)
    pairs = [p for p in pairs if f"{p['chosen_label']}>{p['rejected_label']}" not in exclude]
    pref = _rows(data / "preference.jsonl")
    mixed = pairs + probe_pairs + rng.sample(pref, min(offline, len(pref)))
    rng.shuffle(mixed)
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in mixed))
    return {"prompts": min(prompts, len(sft)), "on_policy_pairs": len(pairs), "on_policy_by_labels": found,
            "excluded": sorted(exclude),
            "probe_prompts": len(probes), "probe_pairs": len(probe_pairs),
            "probe_by_family": _by(probe_pairs, lambda p: p["family"]),
            "offline_pairs": len(mixed) - len(pairs) - len(probe_pairs)}


def _by_labels(pairs: list[dict]) -> dict[str, int]:
    return _by(pairs, lambda p: f"{p['chosen_label']}>{p['rejected_label']}")


def _by(pairs: list[dict], key: Callable[[dict], str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in pairs:
        out[key(p)] = out.get(key(p), 0) + 1
    return dict(sorted(out.items()))


def _rows(path: Path) -> list[dict]:
    return [row for _, row in iter_jsonl(path, "the rows `meshlm align data` wrote")]
