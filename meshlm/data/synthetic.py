"""Small deterministic post-training sets generated from a seed (the embedded default of sft / reward / dpo).

- ``chat``: conversations where the user asks to repeat or reverse a few words and the assistant does it — a
  format and a copy task a tiny model learns within a few hundred steps.
- ``preference``: a prompt of a few words; the *chosen* answer is made of words from a "kind" list, the
  *rejected* one of words from a "rude" list, same length. The property (which list the words come from) is
  what a reward model or DPO must learn, and it is visible on every response token.

Files are written atomically into a cache folder named by (kind, seed, rows), so every rank and every run with
the same seed reads the same bytes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from meshlm.fileio import atomic_write_text

KINDS = ("chat", "preference", "prompt")
SYNTHETIC_VERSION = 1

_WORDS = ("apple river stone cloud green music table window garden paper light water house forest bread "
          "silver winter summer mountain letter").split()
_KIND = "kind gentle helpful thanks please welcome friendly warm honest calm".split()
_RUDE = "stupid ugly awful hate dumb nasty boring lazy rotten gross".split()


def chat_rows(num_rows: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(num_rows):
        words = rng.sample(_WORDS, rng.randint(2, 5))
        if rng.random() < 0.5:
            request, answer = "repeat", words
        else:
            request, answer = "reverse", words[::-1]
        rows.append({"messages": [{"role": "user", "content": f"{request}: {' '.join(words)}"},
                                  {"role": "assistant", "content": " ".join(answer)}]})
    return rows


def preference_rows(num_rows: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(num_rows):
        n = rng.randint(2, 4)
        prompt = "say something about " + " ".join(rng.sample(_WORDS, 2))
        rows.append({"prompt": prompt, "chosen": " " + " ".join(rng.choices(_KIND, k=n)),
                     "rejected": " " + " ".join(rng.choices(_RUDE, k=n))})
    return rows


def prompt_rows(num_rows: int, seed: int) -> list[dict]:
    """Questions whose answer is a count (PPO/GRPO: ``rewards:contains_number`` asks for a digit; ``answer`` holds
    the true count for ``rewards:matches_answer``)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num_rows):
        word = rng.choice(_WORDS)
        count = rng.randint(1, 9)
        rows.append({"prompt": f"{' '.join([word] * count)}. how many {word}? answer with a number:",
                     "answer": str(count)})
    return rows


def write_synthetic(kind: str, out: Path, num_rows: int, seed: int) -> Path:
    """Write a synthetic JSONL set to ``out`` (a file path) atomically; returns it."""
    if kind not in KINDS:
        raise ValueError(f"unknown synthetic set {kind!r}; choose one of {KINDS}")
    rows = {"chat": chat_rows, "preference": preference_rows, "prompt": prompt_rows}[kind](num_rows, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in rows))
    return out


def ensure_synthetic(kind: str, cache_dir: Path, num_rows: int = 512, seed: int = 0) -> Path:
    """The synthetic set in ``cache_dir``, generated on first use."""
    path = Path(cache_dir) / f"synthetic-v{SYNTHETIC_VERSION}-{kind}-{num_rows}-seed{seed}.jsonl"
    if not path.is_file():
        write_synthetic(kind, path, num_rows, seed)
    return path
