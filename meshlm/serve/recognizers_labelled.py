"""Identifiers the text introduces by their label ("My SSN is …", "IBAN: …", "passport no. …"), valid or not.

For an audit log a missed identifier is the costly error: someone who writes "my SSN is 987-65-4321" has pasted an
SSN, mistyped or not, even though area 987 is never issued. So a number-shaped value right after its label (or
right before "is my <label>") is redacted as that type whatever its checksum or issuing rule says; the
validators in :mod:`meshlm.serve.recognizers` decide only for numbers with no label nearby.

What still keeps look-alikes out: the value must carry enough digits for its type (a card's last four, "52
cards", "35x45 mm" are too short); the words between label and value hold no digit and no sentence end, so the
label speaks of this value; dates and times are never identifiers ("account created 2021-03-04"); and labels are
specific ("routing number", not "routing"; "licence no.", not "licence"), so "Routing table has 1024 entries" and
"The license is Apache 2.0" stay.
"""

from __future__ import annotations

import bisect
import re
from typing import Iterator

Span = tuple[int, int, str]

_NO = r"(?:\s*(?:number|num|no\b\.?|nr\b\.?|#|id\b))?"
LABELS: dict[str, str] = {  # type -> label pattern; a value after it of at least MIN_DIGITS digits is that type
    "US_SSN": rf"(?:ssn|ss\s?#|social\s+security{_NO}|social(?=\s+(?:is|was|:|#|no\b)))",
    "CREDIT_CARD": rf"(?:(?:credit|debit|payment|bank)\s*)?card{_NO}|cc{_NO}|visa|master\s?card|amex|"
                   r"american\s+express|discover|maestro|jcb|diners(?:\s+club)?",
    "IBAN": r"iban",
    "ACCOUNT_NUMBER": rf"(?:(?:bank|checking|savings|current|deposit)\s+)?account{_NO}|acct\b\.?{_NO}|"
                      r"sort\s+code|bsb|routing\s+(?:number|no\b\.?|#|code|transit\s+number)|aba(?:\s+routing)?",
    "PASSPORT": rf"passport{_NO}",
    "DRIVER_LICENSE": rf"driver'?s?\s+licen[cs]e{_NO}|driving\s+licen[cs]e{_NO}|licen[cs]e\s*(?:number|num|no\b\.?|#)|"
                      r"dln?\b\s*#?",
    "PHONE": r"(?:tele)?phone(?:\s+(?:number|no\b\.?|#))?|tel\b\.?|mobile|cell(?:phone)?|fax|whatsapp|sms|"
             r"(?:text|call|reach|ring)\s+(?:me|us)(?:\s+(?:at|on))?",
    "TAX_ID": rf"tax\s*(?:payer\s*)?(?:id|identification(?:\s+number)?){_NO}|taxpayer{_NO}|i?tin\b|ein\b|"
              r"steuer-?id|nif\b",
}
MIN_DIGITS = {"US_SSN": 7, "CREDIT_CARD": 12, "IBAN": 8, "ACCOUNT_NUMBER": 6, "PASSPORT": 6, "DRIVER_LICENSE": 5,
              "PHONE": 7, "TAX_ID": 7}

_LABEL = re.compile("|".join(rf"(?P<{t}>(?<![A-Za-z0-9])(?:{p})(?![A-Za-z]))" for t, p in LABELS.items()), re.I)
_PIECE = r"[A-Za-z0-9]{0,24}\d[A-Za-z0-9]{0,24}"  # a group of a number, with at least one digit
# A value: groups joined by one separator, maybe after a short capital prefix ("WX-445-812-09", "AB-1234567").
_VALUE = re.compile(rf"(?<![\w+.-])(?:[A-Z]{{1,3}}-)?[+(]?{_PIECE}"
                    rf"(?:(?:\)\s?|[ .-]\(?|\s?\(){_PIECE}){{0,8}}\)?(?![\w-])")
_IBAN_SHAPE = re.compile(r"(?<![\w+.-])[A-Z]{2}\d{2}(?:[ -]?[A-Z0-9]{4}){2,8}(?:[ -]?[A-Z0-9]{1,3})?(?![\w-])", re.I)
_GAP = re.compile(r"[^\d\n.!?;]{0,32}")  # label ... value: no digit (another number), no sentence end
_AFTER = re.compile(r"\s*(?:is|was|are|=)\s+(?:my|the|our|your|his|her|their|a)\s+(?:[a-z']+\s+){0,2}?$", re.I)
_DATE_OR_TIME = re.compile(r"^(?:\d{4}[-.]\d{1,2}[-.]\d{1,2}|\d{1,2}[-.]\d{1,2}[-.]\d{4}|\d{1,2}[:.]\d{2}(?:\D|$))")
_WINDOW = 48


class _Labels:
    """Every label of a text, found in one pass (so each candidate's look around is a bisection, and the time
    stays linear in the text however many candidates it has)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.found = [(m.start(), m.end(), m.lastgroup) for m in _LABEL.finditer(text)]
        self.ends = [e for _, e, _ in self.found]
        self.starts = [s for s, _, _ in self.found]

    def before(self, start: int) -> str | None:
        """The type of the nearest label ending before ``start`` with only digit-free words in between."""
        i = bisect.bisect_right(self.ends, start)
        while i > 0 and self.ends[i - 1] >= start - _WINDOW:
            s, e, kind = self.found[i - 1]
            if _GAP.fullmatch(self.text, e, start):
                return kind
            i -= 1
        return None

    def after(self, end: int) -> str | None:
        """"4111 … is my card number": the type of a label a few words after ``end``."""
        i = bisect.bisect_left(self.starts, end)
        if i < len(self.found) and self.starts[i] <= end + _WINDOW:
            s, _, kind = self.found[i]
            if _AFTER.fullmatch(self.text, end, s):
                return kind
        return None


def labelled_identifiers(text: str) -> Iterator[Span]:
    labels = _Labels(text)
    if not labels.found:
        return
    for m in _IBAN_SHAPE.finditer(text):  # letter groups too ("GB00 NWBK 6016 …"), which _VALUE does not join
        if labels.before(m.start()) == "IBAN" or labels.after(m.end()) == "IBAN":
            yield m.start(), m.end(), "IBAN"
    for m in _VALUE.finditer(text):
        value = m.group()
        if _DATE_OR_TIME.match(value.lstrip("+(")):
            continue  # "created 2021-03-04", "opens at 09:30": dates and times are not identifiers
        kind = labels.before(m.start()) or labels.after(m.end())
        if kind is None or sum(ch.isdigit() for ch in value) < MIN_DIGITS[kind]:
            continue
        if kind == "IBAN" and not re.match(r"[A-Za-z]{2}\d{2}", value):
            continue
        yield m.start(), m.end(), kind
