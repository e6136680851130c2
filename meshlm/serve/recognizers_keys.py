"""Secrets (API keys, tokens, passwords, private keys) and dates of birth.

Keys are found three ways: vendor prefixes whose format is fixed (``sk-``, ``ghp_``, ``AKIA``, ``xoxb-``, ...);
any value right after a secret word (``api_key=``, ``token:``, ``Bearer``, ``password is``) that looks random
(mixed character classes or high entropy — so "the token count is 512" stays); and long random-looking tokens
with upper case, lower case and digits anywhere. Git hashes (lower-case hex) and UUIDs are none of these.
A date is a date of birth only next to birth words ("born", "DOB", "date of birth", "birthday").
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Iterator

Span = tuple[int, int, str]

_START = r"(?<![A-Za-z0-9_-])"  # never inside a longer token: also keeps "sk-sk-sk-..." linear
_VENDOR_KEYS = re.compile("(?=[A-Za-z-])(?:" + "|".join(_START + p for p in [
    r"sk-(?:proj-|ant-(?:api\d\d-)?|live-|test-|svcacct-)?[A-Za-z0-9_-]{20,512}",  # OpenAI, Anthropic
    r"(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,512}", r"github_pat_[A-Za-z0-9_]{40,512}",  # GitHub
    r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b",  # AWS access key ids
    r"xox[abposr]-[A-Za-z0-9-]{10,512}", r"https://hooks\.slack\.com/services/[A-Za-z0-9/]{1,256}",  # Slack
    r"AIza[0-9A-Za-z_-]{35}", r"ya29\.[0-9A-Za-z_-]{20,512}",  # Google
    r"glpat-[A-Za-z0-9_-]{20,512}", r"hf_[A-Za-z0-9]{30,512}",  # GitLab, Hugging Face
    r"(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{16,512}", r"whsec_[A-Za-z0-9]{24,512}",  # Stripe
    r"SG\.[A-Za-z0-9_-]{16,512}\.[A-Za-z0-9_-]{16,512}", r"npm_[A-Za-z0-9]{36}", r"pypi-[A-Za-z0-9_-]{50,512}",
    r"dop_v1_[a-f0-9]{64}", r"shpat_[a-fA-F0-9]{32}", r"sq0atp-[A-Za-z0-9_-]{22}",
    r"AC[a-f0-9]{32}\b", r"SK[a-f0-9]{32}\b",  # Twilio
    r"eyJ[A-Za-z0-9_-]{8,4096}\.eyJ[A-Za-z0-9_-]{8,4096}\.[A-Za-z0-9_-]{8,4096}",  # JWT
    r"-----BEGIN[A-Z ]{0,20}PRIVATE KEY-----[\s\S]{0,8192}?-----END[A-Z ]{0,20}PRIVATE KEY-----",
]) + ")")
_SECRET_WORD = (r"(?:api[_ .-]?key|apikey|(?:account|shared[_ .-]?access|signing|encryption|master|license|"
                r"subscription|consumer|app|admin|service)[_ .-]?key|access[_ .-]?key(?:[_ .-]?id)?|"
                r"secret(?:[_ .-]?(?:access[_ .-]?)?key)?|"
                r"client[_ .-]?secret|(?:access|auth|api|bearer|refresh|session|bot|personal[_ .-]access)"
                r"[_ .-]?token|token|private[_ .-]?key|passwd|password|passphrase|passcode|pwd|pw|credentials?|"
                r"x-api-key)")
# An identifier may end in a secret word: DATADOG_API_KEY, aws.secret.key, accountKey, clientSecret — so the word
# may follow a non-letter or, camel-case, a lower-case letter when it starts upper-case (not "monkey", "mytoken").
_WORD_START = r"(?:(?<![A-Za-z0-9])|(?<=(?-i:[a-z]))(?=(?-i:[A-Z])))"
_AFTER_WORD = re.compile(  # api_key="...", token: ..., "password is hunter2!", Authorization: Bearer ...
    rf"(?=[A-Za-z]){_WORD_START}{_SECRET_WORD}[\"']?\s*(?P<sep>(?:is|was|=|:|=>|->)\s*|\s)"
    r"(?:set\s+to\s+|now\s+)?[\"'`]?"
    r"(?P<value>[^\s\"'`,;<>)\]}]{6,200})", re.I)
_BEARER = re.compile(r"\b(?:Bearer|Basic|token)\s+(?P<value>[A-Za-z0-9._~+/=-]{16,4096})")
_URL_PASSWORD = re.compile(r"(?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,20}://[^\s:/@]{1,64}:(?P<value>[^\s@/]{3,128})@",
                           re.I)
_RANDOM_TOKEN = re.compile(r"(?<![\w/+=.-])[A-Za-z0-9_\-+/]{32,4096}={0,2}(?![\w/+=-])")


def entropy_bits(s: str) -> float:
    counts = Counter(s)
    return -sum(c / len(s) * math.log2(c / len(s)) for c in counts.values())


def _classes(s: str) -> int:
    return sum(bool(re.search(p, s)) for p in (r"[a-z]", r"[A-Z]", r"\d", r"[^A-Za-z0-9]"))


def looks_secret(value: str) -> bool:
    """A value after a secret word: not a plain word, identifier or number ("is", "required", "user_name", "512")."""
    if len(value) < 6 or value.isdigit() or not value.isascii() or re.search(r"[()\[\]{}]", value):
        return False  # keys and passwords are ASCII; brackets are code or maths ("max(x)", "6·N")
    letters, digits = bool(re.search(r"[A-Za-z]", value)), bool(re.search(r"\d", value))
    symbols = bool(re.search(r"[^\w.-]", value))
    mixed_case = value != value.lower() and value != value.upper()
    return letters and (digits or symbols) or (len(value) >= 20 and entropy_bits(value) >= 3.5 and mixed_case
                                               and "." not in value)


def looks_random_short(token: str) -> bool:
    """A token-shaped value: 12+ URL-safe characters with letters and digits ("abc123def456ghi")."""
    return (len(token) >= 12 and re.fullmatch(r"[A-Za-z0-9._~+/=-]+", token) is not None
            and bool(re.search(r"[A-Za-z]", token)) and bool(re.search(r"\d", token)))


def looks_random(token: str) -> bool:
    """A free-standing token that only a machine writes: long, three character classes, high entropy."""
    core = token.strip("=")
    pieces = re.split(r"[/_-]", core)
    if len(pieces) > 1 and any(len(p) >= 4 and p.isalpha() and p.islower() for p in pieces):
        return False  # a path or identifier ("RUN_DIR/checkpoints/step-00000100"), not random bytes
    return (len(core) >= 32 and bool(re.search(r"[a-z]", core)) and bool(re.search(r"[A-Z]", core))
            and bool(re.search(r"\d", core)) and entropy_bits(core) >= 4.0)


def api_keys(text: str) -> Iterator[Span]:
    for m in _VENDOR_KEYS.finditer(text):
        yield m.start(), m.end(), "API_KEY"
    for rx in (_AFTER_WORD, _BEARER, _URL_PASSWORD):
        for m in rx.finditer(text):
            value = m.group("value").rstrip(".!?:")
            if rx is _AFTER_WORD and not m.group("sep").strip() and not looks_random_short(value):
                continue  # "per token max(...)", "token (measured": a bare space after the word needs a real token
            if rx is _URL_PASSWORD or looks_secret(value):
                yield m.start("value"), m.start("value") + len(value), "API_KEY"
    for m in _RANDOM_TOKEN.finditer(text):
        if looks_random(m.group()):
            yield m.start(), m.end(), "API_KEY"


# ---------------------------------------------------------------------------------------------- date of birth
_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|"
          r"Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?")
_DAY = r"(?:[0-3]?\d)(?:st|nd|rd|th)?"
_DATE = (rf"(?:\d{{4}}[-/.]\d{{1,2}}[-/.]\d{{1,2}}|\d{{1,2}}[-/.]\d{{1,2}}[-/.](?:\d{{4}}|\d{{2}})"
         rf"|{_MONTH}\s+{_DAY},?\s+\d{{4}}|(?:the\s+)?{_DAY}\s+(?:of\s+)?{_MONTH},?\s+\d{{4}}"
         rf"|{_MONTH}\s+{_DAY}(?!\s*,?\s*\d)|(?:the\s+)?{_DAY}\s+(?:of\s+)?{_MONTH}(?!\s*,?\s*\d)"
         rf"|{_MONTH},?\s+\d{{4}}|\d{{1,2}}[-/ ]{_MONTH}[-/ ](?:\d{{4}}|\d{{2}})"  # 01-Jan-1990
         rf"|(?:19|20)\d\d(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])(?!\d)"  # 19900412
         rf"|\d{{1,2}}[/.]\d{{1,2}}(?![/.]?\d)|(?:19|20)\d\d(?![-/.]?\d))")
# Words may be joined by "_", "-" or camel case: birth_date, dateOfBirth, date-of-birth.
_BIRTH_WORD = (r"(?:\bborn|(?<![A-Za-z])birth[\s_-]*date|\bdate[\s_-]*of[\s_-]*birth|(?<![A-Za-z])D\.?O\.?B\b\.?|"
               r"(?<![A-Za-z])birthday|\bb-?day|"
               r"\bb\.(?=\s*\d)|\bgeboren|\bGeburtsdatum|\bné(?:e)?|\bdate\s+de\s+naissance|\bnacid[oa]|"
               r"\bfecha\s+de\s+nacimiento|\bdata\s+di\s+nascita|\bdata\s+de\s+nascimento)")
_DOB = re.compile(rf"(?=[A-Za-zé]){_BIRTH_WORD}[^\n.;]{{0,24}}?(?P<date>{_DATE})\b", re.I)


def dates_of_birth(text: str) -> Iterator[Span]:
    for m in _DOB.finditer(text):
        yield m.start("date"), m.end("date"), "DATE_OF_BIRTH"
