"""Recognisers for the structured PII types: a regular expression proposes a candidate, a validator confirms it.

Validators are what keep look-alikes out: Luhn and issuer prefixes for cards, ISO 13616 length and mod-97 for
IBANs, the SSA's area/group/serial rules for SSNs, :mod:`ipaddress` for IPs (and no "version" nearby), digit
counts and date shapes for phones, entropy and character classes for keys. Each recogniser yields
``(start, end, type)`` spans; :mod:`meshlm.serve.sanitize` resolves overlaps and replaces them.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Iterator

Span = tuple[int, int, str]

# ----------------------------------------------------------------------------------------------------- email
_EMAIL = re.compile(  # bounded repeats (RFC 5321 limits) keep long runs of dots and digits linear
    r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.){1,8}"
    r"[A-Za-z]{2,24}\b")
_AT = r"(?:\s*[\[(<{]\s*at\s*[\])>}]\s*|\s+at\s+)"
_DOT = r"(?:\s*[\[(<{]\s*dot\s*[\])>}]\s*|\s+dot\s+)"
_EMAIL_SPELLED = re.compile(  # "jane.doe [at] example [dot] com", "lars dot nielsen at example dot dk"
    rf"(?<![\w.+-])[\w+-]{{1,64}}(?:(?:\.|{_DOT})[\w+-]{{1,64}}){{0,4}}{_AT}[\w-]{{1,63}}"
    rf"(?:(?:\.|{_DOT})[\w-]{{1,63}}){{0,4}}{_DOT}[A-Za-z]{{2,6}}\b", re.I)


_EMAIL_SPACED = re.compile(  # "jane.roe @ example.com", "jane.roe(at)example.com": the "@" set apart
    r"(?<![\w.+-])[A-Za-z0-9][\w.+%-]{0,63}(?:\s*@\s+|\s*[\[(<{]\s*(?:at|@)\s*[\])>}]\s*)"
    r"(?:[A-Za-z0-9-]{1,63}\s?\.\s?){1,8}[A-Za-z]{2,24}\b", re.I)


def emails(text: str) -> Iterator[Span]:
    for rx in (_EMAIL, _EMAIL_SPELLED, _EMAIL_SPACED):
        for m in rx.finditer(text):
            yield m.start(), m.end(), "EMAIL"


# ----------------------------------------------------------------------------------------------- credit card
_CARD_WORD = re.compile(r"\b(?:card|visa|mastercard|amex|discover|jcb|maestro|credit|debit|cc)\b", re.I)
_CARD = re.compile(r"(?<![\w.-])\d(?:[ .-]?\d){12,18}(?![\w-]|\.\d)")


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_issuer_ok(digits: str) -> bool:
    """Payment cards start with a major industry identifier 2-6 (Mastercard 2-series, Amex/Diners/JCB 3, Visa 4,
    Mastercard/Maestro 5, Discover/UnionPay/Maestro 6); 1, 7, 8, 9 and 0 are airlines, oil, telecoms, national."""
    return digits[0] in "23456" and not (digits[0] == "3" and len(digits) < 14)


def credit_cards(text: str) -> Iterator[Span]:
    for m in _CARD.finditer(text):
        raw = m.group()
        groups = re.split(r"[ .-]", raw)
        if len(groups) > 1 and len(set(re.findall(r"[ .-]", raw))) > 1:
            continue  # mixed separators: not how card numbers are written
        digits = "".join(groups)
        if identifier_before(text, m.start()) and not _CARD_WORD.search(text[max(0, m.start() - 40):m.start()]):
            continue  # "order #4532 ...", "tracking number ...": a Luhn-valid identifier is still an identifier
        if 13 <= len(digits) <= 19 and _card_issuer_ok(digits) and luhn_ok(digits) and len(set(digits)) > 1:
            yield m.start(), m.end(), "CREDIT_CARD"


# ------------------------------------------------------------------------------------------------------ IBAN
# ISO 13616 lengths per country (the registry's published table).
_IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29, "BY": 28,
    "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18,
    "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22,
    "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20,
    "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18,
    "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24, "SC": 31, "SD": 18,
    "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28, "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22,
    "VG": 24, "XK": 20,
}
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:[ -]?[A-Z0-9]{4}){2,7}(?:[ -]?[A-Z0-9]{1,3})?\b", re.I)


def iban_ok(compact: str) -> bool:
    compact = compact.upper()
    if _IBAN_LENGTHS.get(compact[:2]) != len(compact):
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(ch, 36)) for ch in rearranged)) % 97 == 1


def ibans(text: str) -> Iterator[Span]:
    for m in _IBAN.finditer(text):
        raw = m.group()
        # The greedy match may run into the next word's first group: try shorter prefixes of groups as well.
        parts = re.split(r"([ -])", raw)
        for stop in range(len(parts), 0, -2):
            candidate = "".join(parts[:stop])
            if iban_ok(re.sub(r"[ -]", "", candidate)):
                yield m.start(), m.start() + len(candidate), "IBAN"
                break


# ------------------------------------------------------------------------------------------------ IP address
_IPV4 = re.compile(r"(?<![\w.-])(?:\d{1,3}\.){3}\d{1,3}(?:/\d{1,2})?(?![\w-]|\.\d)")
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|(?:\d{1,3}\.){3}\d{1,3})?"
                   r"(?:%[\w]+)?(?:/\d{1,3})?(?![\w:]|\.\d)")
_VERSION_AFTER = re.compile(r"\s*(?:-?(?:rc|beta|alpha|dev|final)\b|(?:version|revision|release|build|update)\b)",
                            re.I)
_VERSION_CONTEXT = re.compile(r"(?:\bv|\bversions?|\bsection|\bchapter|\bclause|\brule|§|\bver\.?|\brelease|"
                              r"\bbuild|\brev(?:ision)?|\bpython|\bnode|"
                              r"\bjava|\bpackage|\bsdk|\bfirmware|\bpatch|\bupgrade[ds]?\s+to|==|>=|<=|~=|@)"
                              r"[\s`'\"(]*$",
                              re.I)


def ip_addresses(text: str) -> Iterator[Span]:
    for m in _IPV4.finditer(text):
        address = m.group().split("/")[0]
        try:
            ipaddress.IPv4Address(address)
        except ValueError:
            continue
        if _VERSION_CONTEXT.search(text[max(0, m.start() - 24):m.start()]) or _VERSION_AFTER.match(text, m.end()):
            continue  # "version 1.2.3.4", "v10.0.0.1", "pkg==2.0.1.0", "section 3.2.1.4", "1.2.0.0 revision"
        yield m.start(), m.end(), "IP_ADDRESS"
    for m in _IPV6.finditer(text):
        address = m.group().split("/")[0].split("%")[0]
        groups = [g for g in re.split(r":", address) if g]
        if len(groups) < 2 or not any(ch.isdigit() for ch in address):
            continue  # "::" alone, "std::vector"-like words
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            continue
        yield m.start(), m.end(), "IP_ADDRESS"


# ----------------------------------------------------------------------------------------------------- US SSN
_SSN = re.compile(r"(?<![\w-])(\d{3})([- ]?)(\d{2})\2(\d{4})(?![\w-])")
# \Z, not $: "$" also matches before a final newline, and a header "ssn,total\n" would label the next row.
_SSN_CONTEXT = re.compile(r"\b(?:ssn|ss#|social\s+security(?:\s+(?:number|no\.?|#))?|taxpayer|tin)\b"
                          r"(?P<gap>[^\n]{0,24})\Z", re.I)


def list_closed(gap: str) -> bool:
    """"ssn, total) VALUES (…": the words after a label close a list it sat in, then go on — a column list, whose
    values the table recognizer pairs up; the label does not speak for the next number."""
    depth = 0
    for i, ch in enumerate(gap):
        depth += (ch in "([") - (ch in ")]")
        if depth < 0:
            return re.match(r"\s*[A-Za-z]", gap[i + 1:]) is not None
    return False


def _said_ssn(text: str, start: int, reach: int) -> bool:
    m = _SSN_CONTEXT.search(text[max(0, start - reach):start])
    return m is not None and not list_closed(m.group("gap"))


def ssn_ok(area: str, group: str, serial: str) -> bool:
    """SSA rules: area 001-899 except 666, group 01-99, serial 0001-9999."""
    a = int(area)
    return 0 < a < 900 and a != 666 and group != "00" and serial != "0000"


def us_ssns(text: str) -> Iterator[Span]:
    for m in _SSN.finditer(text):
        area, sep, group, serial = m.groups()
        if not ssn_ok(area, group, serial):
            continue
        said_ssn = _said_ssn(text, m.start(), 40)
        if not sep and not said_ssn:
            continue  # nine bare digits are an SSN only when the text says so
        if identifier_before(text, m.start()) and not _said_ssn(text, m.start(), 12):
            continue  # "order #123-45-6789", "ssn 987654321 and order 123456789"
        yield m.start(), m.end(), "US_SSN"


# ----------------------------------------------------------------------------------------------------- phone
_SEP = r"[ .\-\u00a0]"
_PHONE_INTL = re.compile(  # +44 20 7946 0958, +1 (415) 555-2671, +49-30-901820, 0049 30 901820
    rf"(?<![\w+])(?:\+|00)[1-9]\d{{0,2}}\)?{_SEP}?(?:\(0?\d{{1,4}}\){_SEP}?)?\d{{1,5}}(?:{_SEP}?\d{{1,5}}){{1,5}}"
    r"(?:\s*(?:x|ext\.?|extension)\s*\d{1,5})?(?![\w+]|[.-]\d)", re.I)
_PHONE_NANP = re.compile(  # (415) 555-2671, 415-555-2671, 415.555.2671, 1-800-555-0199
    rf"(?<![\w+.-])(?:1{_SEP}?)?(?:\(\d{{3}}\){_SEP}?|\d{{3}}{_SEP})\d{{3}}{_SEP}\d{{4}}"
    r"(?:\s*(?:x|ext\.?|extension)\s*\d{1,5})?(?![\w-]|\.\d)", re.I)
_PHONE_NATIONAL = re.compile(  # 020 7946 0958, 07700 900123, 06 12 34 56 78, (030) 901820, 0412 345 678
    rf"(?<![\w+.-])(?:\(0\d{{1,4}}\)|0\d{{1,4}}){_SEP}?\d{{2,4}}(?:{_SEP}?\d{{2,4}}){{1,3}}(?![\w-]|\.\d)")
_PHONE_BARE = re.compile(  # 4155552671, 555-0143: only after a phone word
    r"(?<![\w+.-])(?:\+?\d{7,13}|\d{3}[-. ]\d{4})(?![\w-]|\.\d)")
_PHONE_CONTEXT = re.compile(r"\b(?:phone|tel|telephone|mobile|cell|cellphone|fax|call|text|sms|whatsapp|"
                            r"reach\s+(?:me|us)|ring|contact|number|no\.|ph)\b[^\n\d]{0,20}\Z", re.I)
_IDENTIFIER_CONTEXT = re.compile(r"(?:#|\b(?:order|invoice|ticket|tracking|ref(?:erence)?|case|po|sku|"
                                r"serial|account|acct|isbn|id|model|part|batch|lot|build|version|v)\b)"
                                r"(?:\s*(?:number|no\.?|num|id)\b)?[^\n\d\w]{0,4}(?:is\s+|was\s+|:\s*)?\Z", re.I)
_DATE_SHAPE = re.compile(r"^\d{1,4}[./-]\d{1,2}[./-]\d{1,4}$")


def identifier_before(text: str, start: int) -> bool:
    """An order/ticket/tracking/reference number, or more digit groups right before: an identifier."""
    before = text[max(0, start - 32):start]
    return bool(_IDENTIFIER_CONTEXT.search(before) or re.search(r"\d[ .-]?\Z", before))  # \Z: not before a "\n"


def _phone_digits_ok(raw: str, low: int, high: int) -> bool:
    digits = re.sub(r"\D", "", re.split(r"(?i)x|ext", raw)[0])
    return low <= len(digits) <= high and len(set(digits)) > 2


def phones(text: str) -> Iterator[Span]:
    for m in _PHONE_INTL.finditer(text):
        if _phone_digits_ok(m.group(), 8, 15) and not re.search(r"\d[ .-]?$", text[max(0, m.start() - 2):m.start()]):
            yield m.start(), m.end(), "PHONE"
    for rx, low, high in ((_PHONE_NANP, 10, 11), (_PHONE_NATIONAL, 9, 12)):
        for m in rx.finditer(text):
            raw = m.group()
            if _DATE_SHAPE.match(raw) or not _phone_digits_ok(raw, low, high):
                continue
            if identifier_before(text, m.start()):
                continue  # "order #415-555-2671", "ticket 020 7946 0958": identifiers, not phones
            yield m.start(), m.end(), "PHONE"
    for m in _PHONE_BARE.finditer(text):
        if identifier_before(text, m.start()):
            continue  # "order number 123456789": "number" is the order's
        if _PHONE_CONTEXT.search(text[max(0, m.start() - 32):m.start()]) and _phone_digits_ok(m.group(), 7, 13):
            yield m.start(), m.end(), "PHONE"
