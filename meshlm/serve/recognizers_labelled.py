"""Identifiers the text introduces by their label ("My SSN is …", "IBAN: …", "passport no. …"), valid or not.

For an audit log a missed identifier is the costly error: someone who writes "my SSN is 987-65-4321" has pasted an
SSN, mistyped or not, even though area 987 is never issued. So a number-shaped value near its label is redacted
as that type whatever its checksum or issuing rule says; the validators in :mod:`meshlm.serve.recognizers`
decide only for numbers with no label nearby. A label reaches a value in four ways:

- before it, with only digit-free words between ("SSN, as typed, was …", "ssn\\n…", ``"social_security_number":``);
- after it ("… is my card number", "… (SSN)", "use … as the SSN");
- carried along a list: a value right after a labelled one, joined by a comma, "and", "or", "to", "/", a new list
  line, takes the same label when it has about as many digits ("SSNs: A, B and C", "update the SSN from A to B");
- by column: a table's header or an SQL column list labels the cells under it (:mod:`recognizers_tables`).

What still keeps look-alikes out: the value must carry enough digits for its type (a card's last four, "52
cards", "35x45 mm" are too short); the words between label and value hold no digit and no sentence end; dates and
times are never identifiers ("account created 2021-03-04"); an order/invoice/tracking word before a value keeps it
an identifier of that kind; and labels are specific ("routing number", not "routing"; "licence no.", not
"licence"), so "Routing table has 1024 entries" and "The license is Apache 2.0" stay.
"""

from __future__ import annotations

import bisect
import functools
import re
from typing import Iterator

from meshlm.serve.recognizers import identifier_before, list_closed

Span = tuple[int, int, str]

_S = r"[\s_-]*"  # between the words of a label: "social security", "social_security", "SocialSecurity"
_NO = rf"(?:{_S}(?:numbers?|nums?|nos?\b\.?|nr\b\.?|#|ids?\b|codes?\b))?"
LABELS: dict[str, str] = {  # type -> label pattern; a value near it of at least MIN_DIGITS digits is that type
    "US_SSN": rf"(?:ssns?|s\.\s?s\.\s?n\.?|ss{_S}#|ss{_S}(?:number|no\b\.?)|social{_S}security{_NO}|"
              rf"soc(?:ial)?\.?{_S}sec(?:urity|\.)?{_NO}|"
              rf"social(?=\s+(?:is|was|:|#|no\b)))",
    "CREDIT_CARD": rf"(?:(?:credit|debit|payment|bank){_S})?cards?{_NO}|cc{_NO}|visa|master{_S}card|amex|"
                   rf"american\s+express|discover|maestro|jcb|diners(?:\s+club)?|pan(?=\s*[:#=])",
    "CVV": rf"cvv2?|cvc2?|csc|cid(?=\s*[:#=])|(?:card{_S})?(?:security|verification){_S}(?:code|value)",
    "IBAN": r"ibans?",
    "ACCOUNT_NUMBER": rf"(?:(?:bank|checking|savings|current|deposit){_S})?accounts?{_NO}|acct\b\.?{_NO}|"
                      rf"(?:member|membership|policy|patient|subscriber|insurance){_S}(?:ids?\b|numbers?|"
                      rf"nos?\b\.?|#)|mrn\b|medical{_S}record{_NO}|"
                      rf"sort{_S}codes?|bsb|routing{_S}(?:numbers?|no\b\.?|#|codes?|transit{_S}number)|"
                      rf"aba(?:{_S}routing)?",
    "PASSPORT": rf"passports?{_NO}",
    "DRIVER_LICENSE": rf"driver'?s?{_S}licen[cs]es?{_NO}|driving{_S}licen[cs]es?{_NO}|"
                      rf"licen[cs]e{_S}(?:number|num|no\b\.?|#)|dln?\b\s*#?",
    "PHONE": rf"(?:tele)?phones?(?:{_S}(?:numbers?|no\b\.?|#))?|tel\b\.?|mobile|cell(?:{_S}?phone)?|fax|whatsapp|"
             r"sms|(?:text|call|reach|ring)\s+(?:me|us)(?:\s+(?:at|on))?",
    "TAX_ID": rf"tax{_S}(?:payer{_S})?(?:ids?|identification(?:{_S}numbers?)?|numbers?){_NO}|taxpayer{_NO}|"
              rf"employer{_S}identification{_NO}|tax{_S}file{_NO}|"
              r"i?tins?\b|eins?\b|steuer-?id|steuernummer|nif\b",
    "NATIONAL_ID": rf"national{_S}insurance{_NO}|ni{_S}(?:number|no\b\.?)|nino|nhs{_NO}|social{_S}insurance{_NO}|"
                   rf"sin\b(?=\s*(?:is|was|:|#|number|no\b|\d))|national{_S}id(?:entity)?(?:{_S}card)?{_NO}|"
                   rf"id(?:entity)?{_S}card{_NO}|identity{_S}(?:number|no\b\.?)|id{_S}(?:number|no\b\.?)|"
                   rf"(?:personal|national){_S}identification{_NO}|"
                   rf"medicare{_NO}|health{_S}card{_NO}|aadhaa?r|cpf|curp|dni|nie|bsn|personnummer|"
                   r"personalausweis(?:nummer)?|codice\s+fiscale|pesel|insee",
}
MIN_DIGITS = {"US_SSN": 7, "CREDIT_CARD": 12, "CVV": 3, "IBAN": 8, "ACCOUNT_NUMBER": 6, "PASSPORT": 6,
              "DRIVER_LICENSE": 5, "PHONE": 7, "TAX_ID": 7, "NATIONAL_ID": 6, "DATE_OF_BIRTH": 4}
MAX_DIGITS = {"CVV": 4, "DATE_OF_BIRTH": 8}  # a CVV label reaches no further than a CVV's digits

# A label starts a word, or a camel-case part ("customerSSN", "homePhone"); it ends a word.
_START = r"(?:(?<![A-Za-z0-9])|(?<=(?-i:[a-z]))(?=(?-i:[A-Z])))"
_LABEL = re.compile("|".join(rf"(?P<{t}>{_START}(?:{p})(?![a-z]|(?-i:[A-Z][a-z])))" for t, p in LABELS.items()),
                    re.I)
_PIECE = r"[A-Za-z0-9]{0,24}\d[A-Za-z0-9]{0,24}"  # a group of a number, with at least one digit
# A value: groups joined by one separator (a dash or dot may have a space each side: "987 - 65 - 4321"), maybe
# after a short capital prefix ("WX-445-812-09", "QQ 12 34 56 C") or before one trailing letter.
_JOIN = r"(?:\)\s?|\s?[.\-–/_]\s?\(?|\s\(?|\s?\()"
_VALUE = re.compile(rf"(?:(?<![\w+.-])|(?<=\.\.))(?:[A-Z]{{1,3}}-(?=\d)|[A-Z]{{2}}\s(?=\d\d\s\d\d\s))?[+(]?{_PIECE}"
                    rf"(?:{_JOIN}{_PIECE}){{0,24}}\)?"
                    rf"(?:\s[A-D](?![\w-]))?(?![\w-])")
_IBAN_SHAPE = re.compile(r"(?<![\w+.-])[A-Z]{2}\d{2}(?:[ -]?[A-Z0-9]{4}){2,8}(?:[ -]?[A-Z0-9]{1,3})?(?![\w-])", re.I)
# label ... value: no digit (another number), no sentence end; a line break only right after the label.
_GAP = re.compile(r"[^\d\n.!?;]{0,32}"
                  r"|[?!.]?[^\w\n.!?;]{0,8}\n[^\d\n.!?;]{0,8}"  # "SSN:\n…", "SSN?\n…", not "ssn,total\n…"
                  r"|[?!.:]\s{0,3}"  # "ssn? 987…", "SSN. 987…"
                  r"|\s?[._-]{3,40}:?\s{0,3}"  # dot leaders: "SSN.......... 987…"
                  r"|[^\d\n.!?;]{0,24}:[ \t]*\n\s{0,8}")  # "SSN below:\n\n987…"
# A number shown masked ("***-**-6789", "XXXX XXXX XXXX 4242"): not another value, the label reaches past it.
_MASKED = re.compile(r"(?<![A-Za-z0-9])(?:[*xX•]{2,}[ .-]?){1,4}\d{0,4}(?![A-Za-z0-9])")
_AFTER = re.compile(  # value ... label: "is my card", "(SSN)", "- that's my visa", "as the SSN"
    r"\s*(?:[(\[]\s*(?:(?:both|all|all\s+three|the|my|our|these|those|each|are)\s+)?"
    r"|(?:[-–—,]\s*)?(?:is|was|are|=|as|that'?s|it'?s|this\s+is)\s+"
    r"(?:my|the|our|your|his|her|their|a|an)\s+(?:[a-z']+\s+){0,4}?)$", re.I)
# Between two values of one list: a comma, "and", "or", "to", "/", "|", "then", a list line; a word or two
# ("(old) and", "the new one is") — but no digit and no sentence end.
_CARRY = re.compile(r"[^\d\n.!?]{0,32}|[^\d\n.!?]{0,12}\n[^\d\n.!?]{0,8}")
_DATE_OR_TIME = re.compile(r"^(?:\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{4}|\d{1,2}[:.]\d{2}(?:\D|$)|"
                           r"\d{1,2}/\d{2}$)")
_WINDOW = 48


class Labels:
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
            gap = _MASKED.sub("*", self.text[e:start])
            if _GAP.fullmatch(gap) and not list_closed(gap):
                return kind
            i -= 1
        return None

    def after(self, end: int) -> str | None:
        """"4111 … is my card number", "… (SSN)": the type of a label a few words after ``end``."""
        i = bisect.bisect_left(self.starts, end)
        if i < len(self.found) and self.starts[i] <= end + _WINDOW:
            s, _, kind = self.found[i]
            if _AFTER.fullmatch(self.text, end, s):
                return kind
        return None

    def between(self, start: int, end: int) -> bool:
        """Is there a label inside ``text[start:end]`` (which then speaks for what follows it, not a carry)?"""
        i = bisect.bisect_left(self.starts, start)
        return i < len(self.found) and self.starts[i] < end


def _digits(value: str) -> int:
    return sum(ch.isdigit() for ch in value)


def fits(kind: str, value: str) -> bool:
    """Does ``value`` carry as many digits as an identifier of ``kind`` (and an IBAN's country and check)?"""
    n = _digits(value)
    return MIN_DIGITS[kind] <= n <= MAX_DIGITS.get(kind, 64) and (
        kind != "IBAN" or re.match(r"[A-Za-z]{2}\d{2}", value) is not None)


@functools.lru_cache(maxsize=4096)
def words_of(name: str) -> str:
    """``"customerSSN"`` -> ``"customer SSN"``, ``"card_number"`` -> ``"card number"``: a field or column name as
    words."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=\d)|[^A-Za-z0-9]+", " ",
                    name[:80])
    return " ".join(spaced.split())


_BIRTH_COLUMN = re.compile(r"\b(?:dob|birth|born|birthday|birthdate|date of birth)\b", re.I)


@functools.lru_cache(maxsize=4096)
def label_type(name: str) -> str | None:
    """The identifier type a column or field name announces ("ssn", "card_number", "customerSSN", "dob")."""
    words = words_of(name)
    if _BIRTH_COLUMN.search(words):
        return "DATE_OF_BIRTH"
    m = _LABEL.search(words)
    return m.lastgroup if m else None


def labelled_identifiers(text: str) -> Iterator[Span]:
    labels = Labels(text)
    if not labels.found:
        return
    for m in _IBAN_SHAPE.finditer(text):  # letter groups too ("GB00 NWBK 6016 …"), which _VALUE does not join
        if labels.before(m.start()) == "IBAN" or labels.after(m.end()) == "IBAN":
            yield m.start(), m.end(), "IBAN"
    previous: tuple[int, str, int] | None = None  # (end, type, digits) of the last labelled value
    unlabelled: list[tuple[int, int, int]] = []  # (start, end, digits): a list of values still waiting for a label
    for m in _VALUE.finditer(text):
        value = m.group()
        if _DATE_OR_TIME.match(value.lstrip("+(")):
            continue  # "created 2021-03-04", "opens at 09:30", "exp 01/29": dates and times are not identifiers
        kind, after = labels.before(m.start()), False
        if kind is None and not identifier_before(text, m.start()):
            kind = labels.after(m.end())
            after = kind is not None
        if kind is None and previous is not None:
            kind = _carried(text, labels, previous, m.start(), value)
        if kind is None or not fits(kind, value):
            if unlabelled and not _joined(text, labels, unlabelled[-1][1], m.start()):
                unlabelled.clear()
            unlabelled.append((m.start(), m.end(), _digits(value)))
            continue
        if after:  # "A and B (both SSNs)": the label after the list names the values before it too
            following = m.start()
            for s, e, digits in reversed(unlabelled):
                if not (_joined(text, labels, e, following) and _similar(digits, _digits(value))
                        and fits(kind, text[s:e])):
                    break
                yield s, e, kind
                following = s
        unlabelled.clear()
        previous = (m.end(), kind, _digits(value))
        yield m.start(), m.end(), kind


def _joined(text: str, labels: Labels, end: int, start: int) -> bool:
    """Do the values ending at ``end`` and starting at ``start`` belong to one list (a short digit-free gap with
    no label of its own)?"""
    return _CARRY.fullmatch(text, end, start) is not None and not labels.between(end, start)


def _similar(a: int, b: int) -> bool:
    return abs(a - b) <= max(1, b // 4)


def _carried(text: str, labels: Labels, previous: tuple[int, str, int], start: int, value: str) -> str | None:
    """The previous value's type, when this value continues its list: joined by a short digit-free gap with no
    label of its own, about as many digits (within a quarter), and no order/invoice word before it."""
    end, kind, digits = previous
    if not _joined(text, labels, end, start) or not _similar(_digits(value), digits):
        return None
    return None if identifier_before(text, start) else kind
