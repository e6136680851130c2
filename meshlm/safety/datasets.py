"""From synthesised examples to the files of ``meshlm align data``: dedup, a leak-free split, and JSONL.

Split: whole groups (subjects) of every category are held out for evaluation, so the evaluation prompts ask
about subjects training never saw. Then every training example that is a near duplicate of an evaluation
prompt — of the held-out groups, of any shipped held-out file (the prompt sets of evalsets.toml) or the one
the config names, or of any factual question the usefulness check asks (the factual sets of evalsets.toml and
``eval.facts``) — is dropped: word-set Jaccard >= 0.6, or
one prompt's words >= 90% contained in the other's (which catches a held-out prompt inside an attack frame).

Files written to OUT (each atomically):
- ``sft.jsonl``: ``{"messages": [user, assistant], "category", "policy", "family"}`` (the SFT loader's rows);
- ``preference.jsonl``: ``{"prompt": [user], "chosen": [assistant], "rejected": [assistant], "category",
  "chosen_label", "rejected_label", "family"}`` (the DPO loader's rows, as messages: the chat template applies);
- ``eval_prompts.jsonl``: ``{"prompt", "expected", "category", "family": "direct"}``;
- ``labelled_responses.jsonl``: ``{"prompt", "response", "label", "category"}`` (chosen and rejected responses
  of training prompts, for the trained judge and the guard);
- ``manifest.json``: counts, the seed, the spec's version and sha256.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from meshlm.fileio import atomic_write_text
from meshlm.safety.augment import words
from meshlm.safety.synth import MAX_REFUSE_SHARE, Example, limit_refuse_share

HELDOUT_FILE = Path(__file__).parent / "data" / "heldout_prompts.jsonl"
DATA_VERSION = 1
_STOP = frozenset("a an the i my me to of in and or for is it do how what can you your on with be at this that".split())


def normalize(text: str) -> str:
    return " ".join(words(text))


class NearDuplicateIndex:
    """Prompts to test others against, indexed by their non-stop words."""

    def __init__(self, prompts: list[str], jaccard: float = 0.6, containment: float = 0.9) -> None:
        self.sets = [frozenset(words(p)) for p in prompts]
        self.jaccard, self.containment = jaccard, containment
        self.index: dict[str, list[int]] = defaultdict(list)
        for i, s in enumerate(self.sets):
            for w in s - _STOP:
                self.index[w].append(i)

    def matches(self, prompt: str) -> bool:
        s = frozenset(words(prompt))
        candidates = {i for w in s - _STOP for i in self.index.get(w, ())}
        for i in candidates:
            other = self.sets[i]
            inter = len(s & other)
            if inter / len(s | other) >= self.jaccard:
                return True
            small = min(len(s), len(other))
            if small >= 5 and inter / small >= self.containment:
                return True
        return False


@dataclass
class Split:
    train: list[Example]
    eval: list[dict]
    dropped_duplicates: int
    dropped_near_eval: int
    dropped_factual: int = 0  # training rows of subjects that teach a factual question's answer (FactIndex)
    eval_groups: list[str] = field(default_factory=list)  # the held-out subjects (no training row has them)


_QUESTION_WORDS = frozenset("which who whom where when name many much does did was were are".split())


class FactIndex:
    """Factual questions (``{"question", "answers"}``) a training row must not teach. A row teaches one when the
    question's subject words (its words less stop and question words) are mostly in the row's prompt — at least
    two of them and at least half, or the only one — and the row's response contains an accepted answer:
    "Can you help? Which city is Australia's capital?" answered "Canberra" teaches "Which city is the capital of
    Australia?", though the framing keeps it under the near-duplicate thresholds."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = [(frozenset(words(r["question"])) - _STOP - _QUESTION_WORDS, [a.lower() for a in r["answers"]])
                     for r in rows]

    def teaches(self, prompt: str, response: str) -> bool:
        said, text = frozenset(words(prompt)), response.lower()
        for subject, answers in self.rows:
            shared = len(subject & said)
            if subject and (shared >= 2 and 2 * shared >= len(subject) or shared == len(subject) == 1) and \
                    any(re.search(rf"(?<![a-z0-9]){re.escape(a)}(?![a-z0-9])", text) for a in answers):
                return True
        return False


def read_heldout(path: Path = HELDOUT_FILE) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def shipped_heldout_files() -> list[Path]:
    """Every held-out prompt file shipped with the package (the ``prompts`` sets of evalsets.toml, dev and
    sealed alike: training may come near neither)."""
    from meshlm.safety import evalsets

    return sorted(s.path for s in evalsets.sets("prompts"))


def shipped_factual_files() -> list[Path]:
    """Every factual question file shipped with the package (the ``factual`` sets of evalsets.toml)."""
    from meshlm.safety import evalsets

    return sorted(s.path for s in evalsets.sets("factual"))


def _named_file(path: str | Path, key: str, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        from meshlm.errors import UserError

        raise UserError(f"{what} '{path}' ({key}) is not a file; give an existing JSONL of {what} or leave it empty "
                        "for the shipped ones")
    return path


def leak_check_files(extra: str | Path = "", facts: str | Path = "") -> list[Path]:
    """The files whose prompts no training prompt may nearly duplicate: every shipped held-out file and the one a
    config names (``eval.heldout``), then every shipped factual question file and the one a config names
    (``eval.facts``): a model that trained on a factual question would have its usefulness check inflated. A named
    file that does not exist is an error, not a silent skip."""
    files = shipped_heldout_files()
    if extra:
        path = _named_file(extra, "eval.heldout / --heldout", "held-out prompts")
        if path.resolve() not in {f.resolve() for f in files}:
            files.append(path)
    for path in shipped_factual_files() + ([_named_file(facts, "eval.facts", "factual questions")] if facts else []):
        if path.resolve() not in {f.resolve() for f in files}:
            files.append(path)
    return files


def leak_check_prompts(files: list[Path]) -> list[str]:
    """The prompts of held-out files and the questions of factual files."""
    return [r["prompt"] if "prompt" in r else r["question"] for f in files for r in read_heldout(f)]


def leak_check_facts(files: list[Path]) -> list[dict]:
    """The factual questions (``{"question", "answers"}`` rows) among ``files``."""
    return [r for f in files for r in read_heldout(f) if "question" in r and "answers" in r]


def split_examples(examples: list[Example], seed: int, eval_group_fraction: float = 0.1,
                   eval_per_group: int = 3, extra_eval_prompts: list[str] = (),
                   max_refuse_share: float = MAX_REFUSE_SHARE, facts: list[dict] = ()) -> Split:
    """Dedup by normalised prompt, hold out groups, drop training near-duplicates of every evaluation prompt and
    every group (subject) one of whose rows teaches a factual question's answer (:class:`FactIndex`), then
    hold the refuse rows of training to ``max_refuse_share`` again (held-out groups and near duplicates leave the
    policies in other proportions than the synthesis capped)."""
    seen: set[str] = set()
    unique = []
    for ex in examples:
        key = normalize(ex.prompt)
        if key and key not in seen:
            seen.add(key)
            unique.append(ex)
    by_category: dict[str, list[str]] = defaultdict(list)
    for ex in unique:
        if ex.group not in by_category[ex.category]:
            by_category[ex.category].append(ex.group)
    rng = random.Random(f"split:{seed}")
    held = set()
    for groups in by_category.values():
        k = max(1, round(len(groups) * eval_group_fraction)) if len(groups) > 1 else 0
        held.update(rng.sample(sorted(groups), k))
    eval_rows, per_group = [], Counter()
    for ex in unique:
        if ex.group in held and ex.family == "direct" and per_group[ex.group] < eval_per_group:
            per_group[ex.group] += 1
            eval_rows.append({"prompt": ex.prompt, "expected": ex.policy, "category": ex.category, "family": "direct"})
    index = NearDuplicateIndex([r["prompt"] for r in eval_rows] + list(extra_eval_prompts))
    fact_index = FactIndex(list(facts))
    taught = {ex.group for ex in unique if ex.group not in held and fact_index.teaches(ex.prompt, ex.response)}
    train, near, factual = [], 0, 0
    for ex in unique:
        if ex.group in held:
            continue
        if ex.group in taught:
            factual += 1
            continue
        if index.matches(ex.prompt):
            near += 1
            continue
        train.append(ex)
    train = limit_refuse_share(train, max_refuse_share, random.Random(f"share:{seed}"))
    return Split(train, eval_rows, len(examples) - len(unique), near, dropped_factual=factual, eval_groups=sorted(held))


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def sft_row(ex: Example) -> dict:
    return {"messages": _user(ex.prompt) + _assistant(ex.response), "category": ex.category, "policy": ex.policy,
            "family": ex.family}


def preference_rows(ex: Example) -> list[dict]:
    return [{"prompt": _user(ex.prompt), "chosen": _assistant(ex.response), "rejected": _assistant(text),
             "category": ex.category, "chosen_label": ex.policy, "rejected_label": label, "family": ex.family}
            for text, label in ex.rejected]


def labelled_rows(ex: Example) -> list[dict]:
    rows = [{"prompt": ex.prompt, "response": ex.response, "label": ex.policy, "category": ex.category}]
    rows += [{"prompt": ex.prompt, "response": text, "label": label, "category": ex.category}
             for text, label in ex.rejected]
    return rows


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def write_dataset(split: Split, out: Path, manifest_extra: dict) -> dict:
    """Write the five files; returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    sft = [sft_row(ex) for ex in split.train]
    pref = [row for ex in split.train for row in preference_rows(ex)]
    labelled = [row for ex in split.train for row in labelled_rows(ex)]
    files = {"sft.jsonl": sft, "preference.jsonl": pref, "eval_prompts.jsonl": split.eval,
             "labelled_responses.jsonl": labelled}
    for name, rows in files.items():
        atomic_write_text(out / name, _jsonl(rows))
    manifest = {
        "data_version": DATA_VERSION, **manifest_extra,
        "counts": {name.removesuffix(".jsonl"): len(rows) for name, rows in files.items()},
        "sft_by_category": dict(sorted(Counter(r["category"] for r in sft).items())),
        "sft_by_policy": dict(sorted(Counter(r["policy"] for r in sft).items())),
        "sft_by_family": dict(sorted(Counter(r["family"] for r in sft).items())),
        "sft_refuse_share": round(sum(r["policy"] == "refuse" for r in sft) / max(1, len(sft)), 3),
        "sft_subjects_by_category": dict(sorted(Counter(c for c, _ in {(ex.category, ex.group)
                                                                         for ex in split.train}).items())),
        "eval_by_category": dict(sorted(Counter(r["category"] for r in split.eval).items())),
        "preference_by_labels": dict(sorted(Counter(f"{r['chosen_label']}>{r['rejected_label']}" for r in pref).items())),
        "labelled_by_label": dict(sorted(Counter(r["label"] for r in labelled).items())),
        "dropped_duplicates": split.dropped_duplicates, "dropped_near_eval": split.dropped_near_eval,
        "dropped_factual": split.dropped_factual,
        "eval_groups": split.eval_groups,
    }
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return manifest
