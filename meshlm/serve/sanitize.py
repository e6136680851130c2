"""Replace personal data and secrets in text with typed placeholders (``<EMAIL>``, ``<PERSON>``, ...).

Used on every string the audit log stores, before it touches disk. Each recogniser proposes spans; where spans
overlap, the more specific type wins (a validated card number over a phone-shaped run of digits, an e-mail over
the name inside it), then the longer span. Everything runs on the standard library's ``re``: no model, no
download, a few hundred microseconds per prompt (docs/audit.md has the figures and why not Presidio).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from meshlm.serve.recognizers import credit_cards, emails, ibans, ip_addresses, phones, us_ssns
from meshlm.serve.recognizers_encoded import encoded_tokens, normalized
from meshlm.serve.recognizers_keys import api_keys, dates_of_birth
from meshlm.serve.recognizers_labelled import labelled_identifiers, words_of
from meshlm.serve.recognizers_tables import table_identifiers
from meshlm.serve.recognizers_people import people, street_addresses

PII_TYPES = ("EMAIL", "PHONE", "CREDIT_CARD", "IBAN", "IP_ADDRESS", "US_SSN", "API_KEY", "PERSON",
             "STREET_ADDRESS", "DATE_OF_BIRTH", "ACCOUNT_NUMBER", "PASSPORT", "DRIVER_LICENSE", "TAX_ID",
             "NATIONAL_ID", "CVV")
# Higher wins an overlap: validated and prefix-anchored types first, context-guessed ones last.
_PRIORITY = {"API_KEY": 10, "EMAIL": 9, "CREDIT_CARD": 8, "IBAN": 8, "US_SSN": 7, "DATE_OF_BIRTH": 7,
             "IP_ADDRESS": 6, "STREET_ADDRESS": 5, "PHONE": 4, "PERSON": 3,
             "ACCOUNT_NUMBER": 7, "PASSPORT": 7, "DRIVER_LICENSE": 7, "TAX_ID": 7, "NATIONAL_ID": 7, "CVV": 7}
RECOGNIZERS: tuple[Callable[[str], Iterable[tuple[int, int, str]]], ...] = (
    api_keys, emails, credit_cards, ibans, us_ssns, dates_of_birth, ip_addresses, street_addresses, phones, people,
    labelled_identifiers, table_identifiers)


@dataclass(frozen=True)
class Finding:
    start: int
    end: int
    type: str

    @property
    def placeholder(self) -> str:
        return f"<{self.type}>"


def find_pii(text: str) -> list[Finding]:
    """Non-overlapping findings in ``text``, sorted by position: in the text as written, in its normalized
    reading (escapes decoded, invisible characters dropped, fullwidth digits folded), and inside base64 tokens."""
    found = _candidates(text)
    reading = normalized(text)
    if reading is not None:
        folded, starts, ends = reading
        found += [Finding(starts[f.start], ends[f.end - 1], f.type) for f in _candidates(folded)]
    for start, end, decoded in encoded_tokens(text):
        inner = find_pii(decoded)
        if inner:  # the whole token goes: its decoded text holds personal data
            found.append(Finding(start, end, max(inner, key=lambda f: _PRIORITY[f.type]).type))
    return _resolve(found)


def _candidates(text: str) -> list[Finding]:
    return [Finding(s, e, t) for recognize in RECOGNIZERS for s, e, t in recognize(text) if e > s]


def _resolve(candidates: Iterable[Finding]) -> list[Finding]:
    """Keep the highest-priority, then longest, of overlapping findings."""
    ranked = sorted(candidates, key=lambda f: (-_PRIORITY[f.type], -(f.end - f.start), f.start))
    taken: list[Finding] = []
    for f in ranked:
        if all(f.end <= t.start or f.start >= t.end for t in taken):
            taken.append(f)
    return sorted(taken, key=lambda f: f.start)


def sanitize(text: str) -> str:
    """``text`` with every finding replaced by its placeholder."""
    if not text:
        return text
    return "".join(_pieces(text, find_pii(text)))


# Words of a field name that say what its value is: an identifier's label, a secret, a name, an address.
_FIELD_WORDS = re.compile(
    r"ssn|ss|social|security|card|cc|credit|debit|iban|bic|swift|account|acct|routing|aba|sort|bsb|passport|"
    r"licen[cs]e|driver|dl|dln|phone|tel|telephone|mobile|cell|fax|whatsapp|sms|tax|tin|itin|ein|nif|vat|"
    r"national|nin|nino|sin|nhs|insurance|medicare|aadhaar|pan|cpf|dni|nie|id|ident|identifier|identity|number|"
    r"num|no|nr|name|surname|address|addr|street|email|mail|ip|dob|birth|birthday|birthdate|born|key|token|"
    r"secret|password|passwd|pass|pwd|pw|credential|credentials|auth|bearer|cvv|cvc|csc|pin|routing")


@functools.lru_cache(maxsize=4096)
def field_is_label(field: str | None) -> bool:
    """Does the field's name say its value is personal ("ssn", "cardNumber", "billing_email", "dob")?"""
    return field is not None and any(_FIELD_WORDS.fullmatch(w.lower()) for w in words_of(field).split())


def sanitize_field(field: str | None, text: str) -> str:
    """``text`` as the value of ``field``: a field named like a label labels its value, so {"ssn": "123456789"}
    and {"cardNumber": "4111 1111 1111 1112"} are masked like "SSN: 123456789" would be. The value is also read
    on its own, so the field never hides what the value alone shows."""
    if not text or not field_is_label(field):
        return sanitize(text)
    prefix = words_of(field) + ": "
    labelled = [Finding(max(f.start, len(prefix)) - len(prefix), f.end - len(prefix), f.type)
                for f in find_pii(prefix + text) if f.end > len(prefix)]
    return "".join(_pieces(text, _resolve([*find_pii(text), *labelled])))


def _pieces(text: str, findings: list[Finding]) -> Iterator[str]:
    pos = 0
    for f in findings:
        yield text[pos:f.start]
        yield f.placeholder
        pos = f.end
    yield text[pos:]
