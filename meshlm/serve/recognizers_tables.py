"""Identifiers labelled by their column: a CSV/TSV/Markdown table whose header names the column ("name,ssn,dob"),
or an SQL ``INSERT`` whose column list (or the table's ``CREATE TABLE``) does. The cells under a labelled column
are that type when they carry enough digits for it (:mod:`meshlm.serve.recognizers_labelled` owns the labels and
the digit counts), so "INSERT INTO t (name, ssn) VALUES ('Ann', '987654321')" masks the second value whatever
lies between the label and it. Both scans are single passes over the text.
"""

from __future__ import annotations

import re
from typing import Iterator

from meshlm.serve.recognizers_labelled import fits, label_type

Span = tuple[int, int, str]

_DELIMITERS = ("\t", "|", ";", ",")
_RULE_ROW = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?\s*$")  # Markdown's |---|---|
_INSERT = re.compile(r"\binsert\s+(?:or\s+\w+\s+)?into\s+(?P<table>[\w.\"`\[\]]{1,128})\s*"
                     r"(?:\((?P<columns>[^()]{1,4000})\)\s*)?values\s*(?=\()", re.I)
_COMMA = re.compile(r"\s*,\s*")
_CONSTRAINT = re.compile(r"(?:primary|foreign|unique|check|constraint|key|index)\b", re.I)


_MAX_TUPLE = 20_000  # characters one SQL tuple may span (an unclosed quote stops there, not at the text's end)


def table_identifiers(text: str) -> Iterator[Span]:
    if "," in text or "\t" in text or "|" in text or ";" in text:
        yield from _delimited(text)
    if "values" in text.lower():
        yield from _sql(text)


def _cells(line: str, offset: int, delimiter: str) -> list[tuple[int, int]]:
    """(start, end) of each cell of ``line``, trimmed of blanks and quotes; quoted cells may hold the delimiter."""
    cells, start, quoted = [], 0, False
    for i, ch in enumerate(line):
        if ch == '"':
            quoted = not quoted
        elif ch == delimiter and not quoted:
            cells.append((start, i))
            start = i + 1
    cells.append((start, len(line)))
    out = []
    for s, e in cells:
        while s < e and line[s] in " \"'`":
            s += 1
        while e > s and line[e - 1] in " \"'`\r":
            e -= 1
        out.append((offset + s, offset + e))
    return out


def _header(text: str, cells: list[tuple[int, int]]) -> dict[int, str] | None:
    """Column index -> type for a header row: at least two cells, no digits, at least one labelled column."""
    if len(cells) < 2 or any(re.search(r"\d", text[s:e]) for s, e in cells):
        return None
    kinds = {i: label_type(text[s:e]) for i, (s, e) in enumerate(cells) if 0 < e - s <= 48}
    kinds = {i: k for i, k in kinds.items() if k is not None}
    return kinds or None


def _delimited(text: str) -> Iterator[Span]:
    header: tuple[str, int, dict[int, str]] | None = None  # (delimiter, number of cells, column types)
    offset = 0
    for line in text.split("\n"):
        start, offset = offset, offset + len(line) + 1
        if header is not None:
            delimiter, width, kinds = header
            cells = _cells(line, start, delimiter)
            if len(cells) == width:
                for i, kind in kinds.items():
                    s, e = cells[i]
                    if fits(kind, text[s:e]):
                        yield s, e, kind
                continue
            if _RULE_ROW.match(line):
                continue
            header = None  # the table ended
        for delimiter in _DELIMITERS:
            if delimiter in line:
                cells = _cells(line, start, delimiter)
                kinds = _header(text, cells)
                if kinds:
                    header = (delimiter, len(cells), kinds)
                    break


def _split_tuple(text: str, pos: int) -> tuple[list[tuple[int, int]] | None, int]:
    """The items of the SQL tuple opening at ``text[pos] == "("`` (their (start, end) without quotes) and the
    position after its ")"; (None, where the scan stopped) when it does not close within _MAX_TUPLE."""
    items, depth, quote, start, i = [], 0, "", pos + 1, pos + 1
    stop = min(len(text), pos + _MAX_TUPLE)
    while i < stop:
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch in ",)" and depth == 0:
            items.append(_trim(text, start, i))
            start = i + 1
            if ch == ")":
                return items, i + 1
        elif ch == ")":
            depth -= 1
        i += 1
    return None, stop


def _trim(text: str, s: int, e: int) -> tuple[int, int]:
    while s < e and text[s] in " \t\n'\"":
        s += 1
    while e > s and text[e - 1] in " \t\n'\"":
        e -= 1
    return s, e


def _creates(text: str) -> dict[str, int]:
    """Table name (lower case) -> where its CREATE TABLE's column list opens; one pass."""
    return {m.group(1).strip("\"'`[]").lower(): m.end() for m in
            re.finditer(r"\bcreate\s+table\s+(?:if\s+not\s+exists\s+)?([\w.\"`\[\]]{1,128})\s*(?=\()", text, re.I)}


def _columns(text: str, match: re.Match, creates: dict[str, int]) -> list[str]:
    """The INSERT's column list, or the columns of the table's CREATE TABLE."""
    if match.group("columns"):
        return [c.strip(" \t\n\"'`[]") for c in match.group("columns").split(",")]
    opening = creates.get(match.group("table").strip("\"'`[]").lower())
    items = _split_tuple(text, opening)[0] if opening is not None else None
    if items is None:
        return []
    names = [text[s:e].split()[0].strip("\"'`[]") if text[s:e].split() else "" for s, e in items]
    return [n for n in names if not _CONSTRAINT.match(n)]


def _sql(text: str) -> Iterator[Span]:
    done, creates, known = 0, _creates(text), {}
    for m in _INSERT.finditer(text):
        if m.start() < done:
            continue
        key = m.group("columns") or m.group("table")  # each CREATE TABLE is parsed once, however many INSERTs
        if key not in known:
            known[key] = {i: k for i, k in enumerate(label_type(c) for c in _columns(text, m, creates)) if k}
        kinds = known[key]
        pos = m.end()
        while pos < len(text) and text[pos] == "(":
            items, pos = _split_tuple(text, pos)  # an unclosed tuple: no INSERT inside what it scanned is read
            if items is None:
                break
            for i, kind in kinds.items():
                if i < len(items) and fits(kind, text[items[i][0]:items[i][1]]):
                    yield items[i][0], items[i][1], kind
            comma = _COMMA.match(text, pos)
            if comma is None or not text.startswith("(", comma.end()):
                break
            pos = comma.end()
        done = pos
