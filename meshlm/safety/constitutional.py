"""Constitutional self-critique and revision (Bai et al. 2022, "Constitutional AI", the supervised stage).

For every prompt the model (a meshlm checkpoint or an OpenAI-compatible endpoint, any ``generate(prompts) ->
replies``) answers; then, ``revisions`` times, it critiques its latest answer against one principle of the
spec (drawn from the prompt's category when known, else from all principles) and rewrites the answer to address
the critique. Each step is one batched call over all prompts. Outputs, in the formats of docs/post-training.md:

- ``sft.jsonl``: ``{"messages": [user prompt, assistant final revision], "category", "policy", "principles"}``
- ``preference.jsonl``: ``{"prompt": [user message], "chosen": final revision, "rejected": initial answer, ...}``
  (messages in the prompt: the DPO loader applies the checkpoint's chat template)
- ``trace.jsonl``: every step (initial, critiques, revisions) for inspection; ``manifest.json``: counts.

A revision that is empty is dropped (no SFT row); a pair needs a non-empty initial answer that differs from the
revision. The small embedded model produces text that is not English: the plumbing is the same, the data is
only as good as the model.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshlm.errors import DataError

Generate = Callable[[list[str]], list[str]]

CRITIQUE = (
    "Here is a request from a user and an AI assistant's response to it.\n\n"
    "Request: {prompt}\n\nResponse: {response}\n\n"
    "Critique the response against this principle: {principle}\n"
    "Say specifically where the response falls short of the principle (too harmful, too unhelpful, missing a "
    "caution or a referral, refusing something safe), or say that it already follows it. Be brief."
)
REVISE = (
    "Here is a request from a user, an AI assistant's response, and a critique of that response.\n\n"
    "Request: {prompt}\n\nResponse: {response}\n\nCritique: {critique}\n\n"
    "Principle: {principle}\n{guidance}"
    "Rewrite the response so that it follows the principle and addresses the critique. Reply with the "
    "rewritten response only, addressed to the user."
)


@dataclass(frozen=True)
class Item:
    """A prompt and what the spec says about it (its category's principles and guidance, when known)."""

    prompt: str
    category: str | None = None
    policy: str | None = None
    principles: tuple[str, ...] = ()
    guidance: str = ""


@dataclass
class Result:
    sft: list[dict[str, Any]] = field(default_factory=list)
    preference: list[dict[str, Any]] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)


def items_from_spec(spec: Any, policies: Sequence[str] | None = None) -> list[Item]:
    """Every seed prompt of the spec (of the given policies), with its category's principles and guidance."""
    out = [Item(p, name, cat.policy, tuple(cat.principles), cat.guidance)
           for name, cat in spec.categories.items() if policies is None or cat.policy in policies
           for p in cat.seed_prompts]
    if not out:
        raise DataError("the spec has no seed prompts to critique and revise")
    return out


def read_items(path: str | Path, spec: Any) -> list[Item]:
    """JSONL rows ``{"prompt", "category"?}``; a category of the spec brings its principles and guidance."""
    from meshlm.safety.redteam import read_seed_prompts

    out = []
    for sp in read_seed_prompts(path, spec):
        cat = spec.categories.get(sp.category) if sp.category else None
        out.append(Item(sp.prompt, sp.category, cat.policy if cat else None, tuple(cat.principles) if cat else (),
                        cat.guidance if cat else ""))
    return out


def critique_and_revise(items: Sequence[Item], generate: Generate, principles: Sequence[str], *,
                        revisions: int = 1, seed: int = 0, max_quote_chars: int | None = None) -> Result:
    """Answer -> (critique -> revise) x ``revisions`` for every item; see the module docstring.

    ``max_quote_chars`` shortens the response and critique quoted inside the critique/revision requests (an
    endpoint with a small context refuses a request that does not fit; a checkpoint keeps the prompt's end)."""
    def quote(text: str) -> str:
        text = text or "(empty)"
        return text if max_quote_chars is None or len(text) <= max_quote_chars else text[:max_quote_chars] + " ..."

    if revisions < 1:
        raise DataError(f"--revisions must be at least 1, got {revisions}")
    if not principles and not all(it.principles for it in items):
        raise DataError("no principles to critique against: the spec has none")
    prompts = [it.prompt for it in items]
    initial = _generate(generate, prompts, "initial answers")
    latest, used = list(initial), [[] for _ in items]
    steps: list[list[dict[str, str]]] = [[] for _ in items]
    for rnd in range(revisions):
        chosen = [_principle(it, principles, seed, rnd) for it in items]
        critiques = _generate(generate, [CRITIQUE.format(prompt=it.prompt, response=quote(resp), principle=pr)
                                         for it, resp, pr in zip(items, latest, chosen)], "critiques")
        asks = [REVISE.format(prompt=it.prompt, response=quote(resp), critique=quote(crit), principle=pr,
                              guidance=f"Guidance for this kind of request: {it.guidance}\n" if it.guidance else "")
                for it, resp, crit, pr in zip(items, latest, critiques, chosen)]
        revised = _generate(generate, asks, "revisions")
        for i, (pr, crit, rev) in enumerate(zip(chosen, critiques, revised)):
            used[i].append(pr)
            steps[i].append({"principle": pr, "critique": crit, "revision": rev})
            latest[i] = rev.strip() or latest[i]  # an empty revision keeps the previous answer for the next round
    return _rows(items, initial, latest, steps, used)


def _rows(items: Sequence[Item], initial: list[str], final: list[str], steps: list[list[dict]],
          used: list[list[str]]) -> Result:
    res = Result(stats={"prompts": len(items), "sft_rows": 0, "preference_pairs": 0, "empty_revision": 0,
                        "empty_initial": 0, "unchanged": 0})
    for it, first, last, trail, prs in zip(items, initial, final, steps, used):
        meta = {"category": it.category, "policy": it.policy, "principles": prs, "source": "constitutional"}
        res.trace.append({"prompt": it.prompt, "initial": first, "steps": trail, "final": last, **meta})
        revised = any(s["revision"].strip() for s in trail)
        if not revised:
            res.stats["empty_revision"] += 1
            continue
        res.sft.append({"messages": [{"role": "user", "content": it.prompt},
                                     {"role": "assistant", "content": last}], **meta})
        if not first.strip():
            res.stats["empty_initial"] += 1
        elif first.strip() == last.strip():
            res.stats["unchanged"] += 1
        else:
            res.preference.append({"prompt": [{"role": "user", "content": it.prompt}], "chosen": last,
                                   "rejected": first, **meta})
    res.stats["sft_rows"], res.stats["preference_pairs"] = len(res.sft), len(res.preference)
    return res


def _principle(item: Item, principles: Sequence[str], seed: int, rnd: int) -> str:
    pool = list(item.principles or principles)
    return random.Random(f"{seed}/{rnd}/{item.prompt}").choice(pool)


def _generate(generate: Generate, prompts: list[str], what: str) -> list[str]:
    replies = list(generate(prompts))
    if len(replies) != len(prompts):
        raise DataError(f"the model returned {len(replies)} {what} for {len(prompts)} prompts")
    return [r if isinstance(r, str) else "" for r in replies]


def write_result(result: Result, out: str | Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Write sft.jsonl, preference.jsonl, trace.jsonl and manifest.json (each atomically) into ``out``."""
    from meshlm.fileio import atomic_write_text

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("sft", result.sft), ("preference", result.preference), ("trace", result.trace)):
        atomic_write_text(out / f"{name}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    manifest = {**result.stats, **extra, "files": {"sft": "sft.jsonl", "preference": "preference.jsonl",
                                                     "trace": "trace.jsonl"}}
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return manifest
