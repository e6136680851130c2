"""Second readings of a text, for personal data written so that the plain recognisers miss it.

- :func:`normalized`: invisible characters dropped (zero-width spaces, soft hyphens: ``987\\u200b65\\u200b4321``),
  escapes decoded (``jane%40example.com``, ``&#64;``, ``\\u0040``), fullwidth forms and other scripts' digits
  folded to ASCII (``９８７``), Unicode dashes read as ``-``, the dot of a path before a long number as ``: ``
  (``tool_calls.0.4111111111111111``). Each character of the reading remembers the span of
  the original it came from, so a finding maps back onto the original text.
- :func:`encoded_tokens`: base64 / base64url tokens that decode to readable text (``U1NOOiA5ODctNjUtNDMyMQ==``
  is "SSN: 987-65-4321"); the caller looks for personal data inside and masks the whole token.

Both cost nothing on plain ASCII prose: one regular-expression scan that finds no candidate.
"""

from __future__ import annotations

import base64
import binascii
import html
import re
import unicodedata
from typing import Iterator

_SPECIAL = re.compile(
    r"[\u00ad\u200b-\u200f\u2060-\u2064\ufeff]"  # invisible: dropped
    r"|%[0-9A-Fa-f]{2}|&#(?:\d{1,7}|[xX][0-9A-Fa-f]{1,6});|&(?:commat|period|plus|hyphen|minus|num|lpar|rpar);"
    r"|\\u[0-9A-Fa-f]{4}"  # escapes: decoded
    r"|[\uff01-\uff5e\u2010-\u2015\u2212\u00a0\u2000-\u200a\u202f\u3000]"  # fullwidth, dashes, odd spaces
    r"|(?![0-9])\d"  # another script's digit
    # a path's dot before a long number: "tool_calls.0.4111111111111111" (an error message naming a client's key);
    # read as ": ". Not after a digit alone, so "0.4111111111111111" stays a number.
    r"|(?:(?<=[A-Za-z_\]])|(?<=\.\d)|(?<=\.\d\d))\.(?=\d(?:[ -]?\d){6})")


def _decode(piece: str) -> str:
    if piece == ".":
        return ": "  # not a bare space: a digit and a space before a number make it look like one more group
    if piece[0] == "%":
        return chr(int(piece[1:], 16))
    if piece[0] == "&":
        return html.unescape(piece)
    if piece.startswith("\\u"):
        return chr(int(piece[2:], 16))
    if piece.isdigit():
        return str(unicodedata.digit(piece, 0))
    if unicodedata.category(piece) == "Cf" or piece == "\u00ad":
        return ""
    if piece in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212":
        return "-"
    folded = unicodedata.normalize("NFKC", piece)
    return folded if len(folded) == 1 else piece


def normalized(text: str) -> tuple[str, list[int], list[int]] | None:
    """(the reading, each of its characters' start and end in ``text``), or None when it would equal ``text``."""
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    pos, changed = 0, False
    for m in _SPECIAL.finditer(text):
        out.append(text[pos:m.start()])
        starts.extend(range(pos, m.start()))
        ends.extend(range(pos + 1, m.start() + 1))
        new = _decode(m.group())
        changed = changed or new != m.group()
        out.append(new)
        starts.extend([m.start()] * len(new))
        ends.extend([m.end()] * len(new))
        pos = m.end()
    if not changed:
        return None
    out.append(text[pos:])
    starts.extend(range(pos, len(text)))
    ends.extend(range(pos + 1, len(text) + 1))
    return "".join(out), starts, ends


_TOKEN = re.compile(r"(?<![A-Za-z0-9+/=_-])(?=[A-Za-z0-9+/_-]*\d)[A-Za-z0-9+/_-]{16,8192}={0,2}(?![A-Za-z0-9+/=_-])")


def encoded_tokens(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, decoded text) of each base64 token (with a digit, 16+ characters) that decodes to readable
    UTF-8 text."""
    for m in _TOKEN.finditer(text):
        token = m.group().rstrip("=")
        if len(token) % 4 == 1:
            continue
        alt = b"-_" if ("-" in token or "_" in token) else None
        if alt is not None and ("+" in token or "/" in token):
            continue
        try:
            raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=alt, validate=True)
            decoded = raw.decode("utf-8")
        except (binascii.Error, ValueError):
            continue
        readable = sum(ch.isprintable() or ch in "\n\t" for ch in decoded)
        if decoded and readable >= 0.95 * len(decoded) and re.search(r"[A-Za-z0-9]{2}", decoded):
            yield m.start(), m.end(), decoded
