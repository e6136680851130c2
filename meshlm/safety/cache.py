"""The align pipeline's content-addressed cache of generations and judge labels (``$MESHLM_CACHE/align/``).

What a checkpoint answers depends only on its weights, the model config they run under, the tokens it is given
and how it decodes; what a judge labels depends only on the judge and the pairs it reads. The base model's
held-out evaluation, its factual answers and its self-distilled targets are therefore the same in every run that
starts from the same base, and recomputing them was most of a run's hour. Each ``generate(prompts)`` call and
each ``judge.label(prompts, responses)`` call is one entry, a JSON file named by the sha256 of everything its
result depends on:

- ``generate/<key>.json``: the weights' sha256 (:func:`meshlm.checkpoint.load.weights_sha256`, the figure
  ``meshlm inspect`` prints), the model config (every field but ``source``), the tokenizer file's sha256, every
  prompt's token ids (chat template and system message applied, truncation included), the sampling settings
  (max_new_tokens, eos ids, greedy or temperature, top-k/p), the weight format (fp32 or int8), the device, the
  random generator's state when sampling, the batch (its prompts, in order: a batch's rows decode together) and
  the sha256 of meshlm's decoding code. It stores the prompts and the responses (and the generator's state after
  the call, restored on a hit).
- ``label/<key>.json``: the judge's name, its version (the sha256 of the judges' code, of the model code trained
  judges run and of the judge's folder) and the (prompt, response) pairs. A judge that reads something outside
  meshlm and its folder (an ``llm:`` endpoint, whose model may change behind its name) is never cached.

A pipeline batch is one entry, so a changed prompt misses only its batch, and a changed judge, decode setting,
weight or model config misses every entry it touches. An entry is used only if its stored prompts (and
responses) equal the asked ones, and an unreadable entry counts as a miss and is rewritten. Writes are atomic
(temp file + rename), so pipelines sharing the folder see whole entries or none. ``meshlm align --no-cache``
neither reads nor writes.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from meshlm.fileio import atomic_write_text

FORMAT = 1  # bump when an entry's layout changes
PACKAGE = Path(__file__).resolve().parent.parent
# The code a generation runs through (prompt encoding, the forward, the decode loop, detokenising) and the code
# every judge shares, with the model code the trained judges run (their decoder or encoder, its tokenizer, the
# classifier head and input encoding, checkpoint loading): part of the keys, so an upgraded meshlm never reads its
# predecessor's answers.
DECODE_CODE = ("generate", "models", "tokenizer", "data/posttrain/templates.py", "safety/generation.py")
JUDGE_CODE = ("safety/judges", "safety/rules", "safety/degenerate.py", "safety/taxonomy.py",
              "safety/encoder_judge.py", "safety/classifier.py", "models", "tokenizer", "checkpoint/load.py",
              "data/posttrain/labelled.py", "objectives/classify.py")


def cache_root() -> Path:
    """``$MESHLM_CACHE/align`` (default ``~/.cache/meshlm/align``), as ``meshlm fetch`` resolves the cache."""
    from meshlm.data.prepare import default_cache_dir

    return default_cache_dir() / "align"


def digest(value: Any) -> str:
    """sha256 of ``value`` as canonical JSON."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def tree_sha256(paths: Sequence[Path]) -> str:
    """sha256 over the files at or under ``paths`` (names relative to their root, then contents), in order."""
    h = hashlib.sha256()
    for root in paths:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc":
                continue
            h.update(f"{f.relative_to(root.parent)}|".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def code_sha256(parts: tuple[str, ...]) -> str:
    return tree_sha256([PACKAGE / p for p in parts])


def judge_version(judge) -> str | None:
    """The judge's version for a label key: its code and, for ``KIND:DIR``, its folder's files; None when the
    judge reads something else (an endpoint): its labels are not cached."""
    _, _, arg = judge.name.partition(":")
    if arg and not Path(arg).is_dir():
        return None
    return tree_sha256([PACKAGE / p for p in JUDGE_CODE] + ([Path(arg).resolve()] if arg else []))


class AlignCache:
    """Entries under ``root`` (None: disabled) and the hits and misses counted so far, by kind."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.counts = {"generate": {"hits": 0, "misses": 0}, "label": {"hits": 0, "misses": 0}}

    def snapshot(self) -> dict[str, dict[str, int]]:
        return json.loads(json.dumps(self.counts))

    def since(self, before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        """Hits and misses counted after ``before`` (a :meth:`snapshot`)."""
        return {kind: {k: v - before[kind][k] for k, v in c.items()} for kind, c in self.counts.items()}

    def _path(self, kind: str, key: str) -> Path:
        assert self.root is not None
        return self.root / kind / key[:2] / f"{key}.json"

    def get(self, kind: str, key: str, check: Callable[[dict], bool]) -> dict | None:
        entry = None
        path = self._path(kind, key)
        if path.is_file():
            try:
                entry = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                entry = None  # unreadable: recomputed and rewritten
            if entry is not None and not (isinstance(entry, dict) and entry.get("format") == FORMAT and check(entry)):
                entry = None
        self.counts[kind]["hits" if entry is not None else "misses"] += 1
        return entry

    def put(self, kind: str, key: str, entry: dict) -> None:
        path = self._path(kind, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"format": FORMAT, **entry}, ensure_ascii=False) + "\n")

    def generator(self, make: Callable[[], Any]) -> Callable[[list[str]], list[str]]:
        """A ``generate(prompts)`` over the generator ``make()`` builds on first use (a
        :class:`meshlm.safety.generation.CheckpointGenerator` or a view of one), its calls served from here."""
        return CachedGenerate(make, self if self.root is not None else None)

    def judge(self, judge):
        """``judge`` with its ``label`` calls served from here (``judge`` itself when disabled or uncacheable)."""
        if self.root is None:
            return judge
        version = judge_version(judge)
        return judge if version is None else CachedJudge(judge, version, self)


class CachedGenerate:
    def __init__(self, make: Callable[[], Any], cache: AlignCache | None) -> None:
        self.make, self.cache, self._gen = make, cache, None

    @property
    def gen(self):
        if self._gen is None:
            self._gen = self.make()
        return self._gen

    def __call__(self, prompts: list[str]) -> list[str]:
        if self.cache is None or not prompts:
            return self.gen(prompts)
        gen, prompts = self.gen, list(prompts)
        rng = gen.generator
        parts = {**gen.cache_key(prompts), "code": code_sha256(DECODE_CODE),
                 "rng": None if rng is None else hashlib.sha256(rng.get_state().numpy().tobytes()).hexdigest()}
        key = digest(parts)
        entry = self.cache.get("generate", key, lambda e: e.get("prompts") == prompts
                               and len(e.get("responses", ())) == len(prompts))
        if entry is not None:
            if rng is not None:
                rng.set_state(torch.frombuffer(bytearray(base64.b64decode(entry["rng_after"])), dtype=torch.uint8))
            return list(entry["responses"])
        responses = gen(prompts)
        summary = {k: (digest(v) if k == "prompt_ids" else v) for k, v in parts.items()}
        self.cache.put("generate", key, {"key": summary, "prompts": prompts, "responses": responses,
                                         "rng_after": None if rng is None else
                                         base64.b64encode(rng.get_state().numpy().tobytes()).decode()})
        return responses

    def stats(self) -> dict[str, Any]:
        """The wrapped generator's own counts (cumulative; what the cache served was not decoded, so it adds no
        seconds and no tokens): the ``generation`` blocks of the align stages count what was really decoded."""
        inner = getattr(self._gen, "stats", None)
        if callable(inner):
            return inner()
        return {"new_tokens": 0 if self._gen is None else None}


class CachedJudge:
    """A judge whose ``label`` calls are served from the cache; everything else is the judge's own."""

    def __init__(self, judge, version: str, cache: AlignCache) -> None:
        self.inner, self.version, self.cache = judge, version, cache

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def label(self, prompts: Sequence[str], responses: Sequence[str]) -> list[str]:
        pairs = [list(prompts), list(responses)]
        key = digest({"judge": self.inner.name, "version": self.version, "pairs": digest(pairs)})
        entry = self.cache.get("label", key, lambda e: e.get("pairs") == digest(pairs)
                               and len(e.get("labels", ())) == len(responses))
        if entry is not None:
            return list(entry["labels"])
        labels = self.inner.label(prompts, responses)
        self.cache.put("label", key, {"judge": self.inner.name, "version": self.version, "pairs": digest(pairs),
                                      "labels": labels})
        return labels
