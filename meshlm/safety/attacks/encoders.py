"""The encodings attacks hide a request in: base64, rot13 and leetspeak, one implementation each.

``ENCODINGS`` are exact bijections on text (tested as ``decode(encode(x)) == x``), used by the evaluation
attacks. The training frames' leetspeak is the older one-way form (lower-cased, letters to digits, digits kept),
kept byte for byte so that synthesis does not change: :func:`leet` with ``reversible=False``.
"""

from __future__ import annotations

import base64
import codecs
from collections.abc import Callable

_LEET_SWAP = str.maketrans("aeiost" + "431057", "431057" + "aeiost")  # a swap: its own inverse, hence a bijection
_LEET_ONE_WAY = str.maketrans({"a": "4", "e": "3", "i": "1", "o": "0", "s": "5", "t": "7"})


def b64_encode(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def b64_decode(text: str) -> str:
    return base64.b64decode(text.encode("ascii"), validate=True).decode("utf-8")


def rot13(text: str) -> str:
    return codecs.encode(text, "rot13")  # its own inverse; letters outside a-z/A-Z are kept


def leet(text: str, reversible: bool = True) -> str:
    """Leetspeak. Reversible: a character swap (a<->4, e<->3, i<->1, o<->0, s<->5, t<->7), digits in the text
    becoming the letters, so decoding is the same swap and the round trip is exact. Not reversible: the text
    lower-cased and those letters made digits (digits kept), as the training frames have always written it."""
    return text.translate(_LEET_SWAP) if reversible else text.lower().translate(_LEET_ONE_WAY)


ENCODINGS: dict[str, tuple[Callable[[str], str], Callable[[str], str]]] = {
    "base64": (b64_encode, b64_decode),
    "rot13": (rot13, rot13),
    "leetspeak": (leet, leet),
}
# the schemes of the training frames ("leet" is the one-way leetspeak)
TRAINING_SCHEMES: dict[str, Callable[[str], str]] = {
    "base64": b64_encode, "rot13": rot13, "leet": lambda text: leet(text, reversible=False)}


def encode(name: str, text: str) -> str:
    return ENCODINGS[name][0](text)


def decode(name: str, text: str) -> str:
    return ENCODINGS[name][1](text)
