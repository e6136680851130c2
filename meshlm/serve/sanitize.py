"""Replace personal data and secrets in text with typed placeholders (``<EMAIL>``, ``<PERSON>``, ...).

Used on every string the audit log stores, before it touches disk. Each recogniser proposes spans; where spans
overlap, the more specific type wins (a validated card number over a phone-shaped run of digits, an e-mail over
the name inside it), then the longer span. Everything runs on the standard library's ``re``: no model, no
download, a few hundred microseconds per prompt (docs/audit.md has the figures and why not Presidio).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from meshlm.serve.recognizers import credit_cards, emails, ibans, ip_addresses, phones, us_ssns
from meshlm.serve.recognizers_keys import api_keys, dates_of_birth
from meshlm.serve.recognizers_labelled import labelled_identifiers
from meshlm.serve.recognizers_people import people, street_addresses

PII_TYPES = ("EMAIL", "PHONE", "CREDIT_CARD", "IBAN", "IP_ADDRESS", "US_SSN", "API_KEY", "PERSON",
             "STREET_ADDRESS", "DATE_OF_BIRTH", "ACCOUNT_NUMBER", "PASSPORT", "DRIVER_LICENSE", "TAX_ID")
# Higher wins an overlap: validated and prefix-anchored types first, context-guessed ones last.
_PRIORITY = {"API_KEY": 10, "EMAIL": 9, "CREDIT_CARD": 8, "IBAN": 8, "US_SSN": 7, "DATE_OF_BIRTH": 7,
             "IP_ADDRESS": 6, "STREET_ADDRESS": 5, "PHONE": 4, "PERSON": 3,
             "ACCOUNT_NUMBER": 7, "PASSPORT": 7, "DRIVER_LICENSE": 7, "TAX_ID": 7}
RECOGNIZERS: tuple[Callable[[str], Iterable[tuple[int, int, str]]], ...] = (
    api_keys, emails, credit_cards, ibans, us_ssns, dates_of_birth, ip_addresses, street_addresses, phones, people,
    labelled_identifiers)


@dataclass(frozen=True)
class Finding:
    start: int
    end: int
    type: str

    @property
    def placeholder(self) -> str:
        return f"<{self.type}>"


def find_pii(text: str) -> list[Finding]:
    """Non-overlapping findings in ``text``, sorted by position."""
    candidates = [Finding(s, e, t) for recognize in RECOGNIZERS for s, e, t in recognize(text) if e > s]
    candidates.sort(key=lambda f: (-_PRIORITY[f.type], -(f.end - f.start), f.start))
    taken: list[Finding] = []
    for f in candidates:
        if all(f.end <= t.start or f.start >= t.end for t in taken):
            taken.append(f)
    return sorted(taken, key=lambda f: f.start)


def sanitize(text: str) -> str:
    """``text`` with every finding replaced by its placeholder."""
    if not text:
        return text
    return "".join(_pieces(text, find_pii(text)))


def _pieces(text: str, findings: list[Finding]) -> Iterator[str]:
    pos = 0
    for f in findings:
        yield text[pos:f.start]
        yield f.placeholder
        pos = f.end
    yield text[pos:]
