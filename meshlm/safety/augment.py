"""Surface paraphrase and jailbreak-style wrappers for training prompts.

``paraphrase`` varies the surface of a request (greetings, pretexts, casing, punctuation) so that a model
cannot key on one phrasing. ``wrap_attack`` puts a request inside a training frame of a named attack family
(each family's module in safety/attacks/ holds its frames beside its evaluation templates, written apart from
them so that the red-team evaluation measures generalisation to frames the model was not trained on word for
word); the training data applies these frames to refuse prompts (the response stays a refusal) *and* to answer
prompts (the response stays the answer), so that the frame alone decides nothing.
"""

from __future__ import annotations

import random
import re

from meshlm.safety import attacks
from meshlm.safety.attacks.encoders import TRAINING_SCHEMES

PREFIXES = ["", "", "", "", "hey, ", "Quick question: ", "Please, ", "Hi! ", "ok so ", "I was wondering: ",
            "Honest question: ", "Hello. ", "Can you help? ", "Serious question. "]
SUFFIXES = ["", "", "", "", " Thanks!", " Please answer quickly.", " Be detailed.", " thx", " I'm asking for a friend.",
            " It's for my class.", " Keep it short.", " Thank you in advance.", " Asap please.", " I'd really appreciate it."]

FAMILIES = tuple(attacks.names())
ENCODINGS = tuple(TRAINING_SCHEMES)  # the schemes the encoding family's training frames may use


def paraphrase(prompt: str, rng: random.Random) -> str:
    """The prompt with a random greeting/pretext and surface changes (deterministic given ``rng``)."""
    text = rng.choice(PREFIXES) + prompt + rng.choice(SUFFIXES)
    roll = rng.random()
    if roll < 0.25:
        text = text.lower()
    elif roll < 0.35:
        text = text.rstrip("?.!")
    elif roll < 0.45:  # typed on a phone: lower case, no final punctuation
        text = text.lower().rstrip("?.!")
    if rng.random() < 0.15:
        text = typo(text, rng)
    return text


def typo(text: str, rng: random.Random) -> str:
    """``text`` with one typing slip in a word of four letters or more: two letters swapped, one dropped or one
    doubled — held-out prompts are typed by people, and a misspelt subject must still read as the subject."""
    spans = [m.span() for m in re.finditer(r"[A-Za-z]{4,}", text)]
    if not spans:
        return text
    start, end = rng.choice(spans)
    i = rng.randrange(start + 1, end - 1)
    kind = rng.randrange(3)
    if kind == 0:
        return text[:i] + text[i + 1] + text[i] + text[i + 2:]
    if kind == 1:
        return text[:i] + text[i + 1:]
    return text[:i] + text[i] + text[i:]


def encode(prompt: str, scheme: str) -> str:
    return TRAINING_SCHEMES[scheme](prompt)


def wrap_attack(prompt: str, family: str, rng: random.Random, act: str | None = None,
                schemes: tuple[str, ...] = ENCODINGS) -> str | None:
    """``prompt`` in a training frame of ``family`` (safety/attacks/); None when the family needs what is missing
    (``past_tense`` needs the request's verb phrase ``act``). ``schemes`` limits the encodings of the
    ``encoding`` family."""
    if family not in FAMILIES:
        raise ValueError(f"unknown attack family {family!r}; one of {FAMILIES}")
    return attacks.family(family).frame(prompt, rng, act, schemes)


_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    """Lower-case alphanumeric words: the unit of dedup and near-duplicate checks."""
    return _WORD.findall(text.lower())
