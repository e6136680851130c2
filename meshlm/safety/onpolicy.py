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


def write_on_policy_preferences(data: Path, out: Path, generate: Generate, label: Label, *, prompts: int,
                                offline: int, seed: int, batch_size: int = 48) -> dict:
    """``out``: the on-policy pairs of ``prompts`` sampled training prompts plus ``offline`` sampled rows of
    ``data/preference.jsonl`` (so every label pair stays represented); returns counts for the report."""
    rng = random.Random(f"on-policy:{seed}")
    sft = _rows(data / "sft.jsonl")
    pairs = on_policy_pairs(rng.sample(sft, min(prompts, len(sft))), generate, label, batch_size=batch_size)
    pref = _rows(data / "preference.jsonl")
    mixed = pairs + rng.sample(pref, min(offline, len(pref)))
    rng.shuffle(mixed)
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in mixed))
    by = {}
    for p in pairs:
        key = f"{p['chosen_label']}>{p['rejected_label']}"
        by[key] = by.get(key, 0) + 1
    return {"prompts": min(prompts, len(sft)), "on_policy_pairs": len(pairs), "offline_pairs": len(mixed) - len(pairs),
            "on_policy_by_labels": dict(sorted(by.items()))}


def _rows(path: Path) -> list[dict]:
    return [row for _, row in iter_jsonl(path, "the rows `meshlm align data` wrote")]
