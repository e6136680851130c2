"""Post-training rows from JSON Lines: recognised by their keys, validated, located by ``file:line``.

Row kinds (see docs/post-training.md):

- ``conversation``: ``{"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}``
- ``prompt_completion``: ``{"prompt": str, "completion": str}``
- ``preference``: ``{"prompt": str|messages, "chosen": str|messages, "rejected": str|messages}``
- ``unpaired``: ``{"prompt": str|messages, "completion": str|messages, "label": bool}`` (KTO: a desirable
  (true) or undesirable (false) completion, TRL's unpaired preference format)
- ``prompt``: ``{"prompt": str|messages, ...}``; the other fields are kept in ``Row.extra`` (a reward function
  may read them).
- ``labelled``: ``{"prompt": str, "response": str, "label": str}`` (a classifier's example: the class name of a
  (prompt, response) pair; without ``response``, of the prompt alone). Either text may be empty.

A field that is missing, empty or of the wrong type, an unknown role, or a row whose kind the objective cannot
use raises :class:`DataError` naming the file, the line and the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from meshlm.config.catalog import import_objective
from meshlm.data.readers import JSONL_SUFFIXES, ReadStats, _expand, has_utf8_form
from meshlm.errors import DataError

ROLES = ("system", "user", "assistant")
Message = dict[str, str]  # {"role": ..., "content": ...}
Text = Union[str, list[Message]]  # a plain string or a list of messages

# The row kinds each data kind (an objective's ``data_kind``, meshlm/objectives/base.py) accepts. An objective
# declares its data kind in its own module; a new objective that reads one of these touches nothing here.
DATA_KINDS: dict[str, tuple[str, ...]] = {
    "sft": ("conversation", "prompt_completion"),
    "preference": ("preference",),
    "unpaired": ("unpaired", "preference"),  # KTO; a preference row gives two items
    "prompt": ("prompt",),
    "labelled": ("labelled",),  # a classifier's examples (objectives/classify.py)
}
_KIND_HELP = ('{"messages": [...]}, {"prompt", "completion"}, {"prompt", "chosen", "rejected"}, {"prompt", '
              '"completion", "label"}, {"prompt", "response", "label"} or {"prompt"} (prompts only)')


@dataclass(frozen=True)
class Row:
    """One validated row. Only the fields of its kind are set."""

    kind: str
    where: str  # "file:line"
    messages: list[Message] | None = None
    prompt: Text | None = None
    completion: Text | None = None  # a string, or assistant messages for an unpaired row; a labelled row's response
    chosen: Text | None = None
    rejected: Text | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    label: bool | str | None = None  # unpaired rows: desirable (True) or not (False); labelled rows: the class


def read_rows(paths: str | os.PathLike | Sequence[str | os.PathLike], objective: str | None = None,
              data_kind: str | None = None) -> list[Row]:
    """All rows of ``paths`` (JSONL files or folders of them, read in sorted order), checked for ``data_kind``
    (or, when only ``objective`` is given, the data kind of that ``training.objective``)."""
    rows = list(iter_rows(paths))
    if not rows:
        raise DataError(f"no rows in {paths}; data.path must name a JSONL file (or a folder of them) with one "
                        "JSON object per line")
    if data_kind is None and objective is not None:
        data_kind = objective_data_kind(objective)
    if data_kind is not None:
        check_kinds(rows, data_kind, objective or data_kind)
    return rows


def objective_data_kind(objective: str) -> str:
    """The data kind ``training.objective = objective`` reads (with its default [objective] section)."""
    kind = import_objective(objective).data_kind  # through the registry: objectives build on data
    if kind not in DATA_KINDS:
        raise DataError(f"objective {objective!r} reads no JSONL rows (its data is {kind!r})")
    return kind


def iter_rows(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> Iterator[Row]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    for path in paths:
        for file in _expand(Path(path), ReadStats()):
            if file.suffix.lower() not in JSONL_SUFFIXES:
                if not Path(path).is_dir():
                    raise DataError(f"data.path {file} is not a JSON Lines file; post-training data is .jsonl "
                                    "(or .json holding JSON Lines), one row per line")
                continue  # other files in a folder are ignored, as `prepare` does
            yield from _read_file(file)


def check_kinds(rows: Sequence[Row], data_kind: str, objective: str | None = None) -> None:
    """Raise if a row's kind is not one ``data_kind`` accepts (``objective`` names the reader in the message)."""
    if data_kind not in DATA_KINDS:
        raise DataError(f"data kind {data_kind!r} is not JSONL rows; choose one of {sorted(DATA_KINDS)}")
    allowed = DATA_KINDS[data_kind]
    objective = objective or data_kind
    for row in rows:
        if row.kind not in allowed:
            raise DataError(f"{row.where}: a {row.kind} row, but training.objective={objective!r} reads "
                            f"{' or '.join(allowed)} rows; use a dataset of that kind or change the objective")


def _read_file(path: Path) -> Iterator[Row]:
    try:
        raw_lines = path.read_bytes().split(b"\n")
    except OSError as e:
        raise DataError(f"cannot read {path} ({e.strerror or e}); check the path and its permissions") from e
    for lineno, raw in enumerate(raw_lines, start=1):
        where = f"{path}:{lineno}"
        try:
            line = raw.decode("utf-8").lstrip("\ufeff") if lineno == 1 else raw.decode("utf-8")
        except UnicodeDecodeError:
            raise DataError(f"{where}: not valid UTF-8; fix or remove the line") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno}); one JSON object per line") from e
        if not isinstance(record, dict):
            raise DataError(f"{where}: a JSON {type(record).__name__}, expected an object: {_KIND_HELP}")
        yield parse_row(record, where)


def parse_row(record: dict[str, Any], where: str) -> Row:
    """Recognise and validate one JSON object."""
    if "messages" in record:
        return Row("conversation", where, messages=_messages(record["messages"], where, "messages", final=True))
    if "chosen" in record or "rejected" in record:
        for key in ("prompt", "chosen", "rejected"):
            if key not in record:
                raise DataError(f"{where}: preference row without field {key!r}; it needs prompt, chosen and "
                                "rejected")
        return Row("preference", where, prompt=_text(record["prompt"], where, "prompt"),
                   chosen=_text(record["chosen"], where, "chosen", assistant=True),
                   rejected=_text(record["rejected"], where, "rejected", assistant=True))
    if "label" in record and "completion" in record:
        for key in ("prompt", "completion"):
            if key not in record:
                raise DataError(f"{where}: unpaired row without field {key!r}; it needs prompt, completion and label")
        if not isinstance(record["label"], bool):
            raise DataError(f"{where}: field 'label' is {record['label']!r}; use true (desirable) or false "
                            "(undesirable)")
        return Row("unpaired", where, prompt=_text(record["prompt"], where, "prompt"),
                   completion=_text(record["completion"], where, "completion", assistant=True),
                   label=record["label"])
    if "label" in record and ("response" in record or isinstance(record["label"], str)):
        return _labelled(record, where)
    if "prompt" in record and "completion" in record:
        return Row("prompt_completion", where, prompt=_string(record["prompt"], where, "prompt"),
                   completion=_string(record["completion"], where, "completion"))
    if "prompt" in record:
        extra = {k: v for k, v in record.items() if k != "prompt"}
        return Row("prompt", where, prompt=_text(record["prompt"], where, "prompt"), extra=extra)
    keys = ", ".join(sorted(record)) or "none"
    raise DataError(f"{where}: unrecognised row (keys: {keys}); a row is one of {_KIND_HELP}")


def _labelled(record: dict[str, Any], where: str) -> Row:
    """A classifier's example; its texts may be empty (an empty response is something to classify)."""
    label = record["label"]
    if not isinstance(label, str) or not label.strip():
        raise DataError(f"{where}: field 'label' is {label!r}; a labelled row's label is a class name (a string)")
    texts = {}
    for key in ("prompt", "response"):
        value = record.get(key, "" if key == "prompt" else None)
        if value is not None and not (isinstance(value, str) and has_utf8_form(value)):
            raise DataError(f"{where}: field {key!r} of a labelled row must be a string (with a UTF-8 form)")
        texts[key] = value
    return Row("labelled", where, prompt=texts["prompt"], completion=texts["response"], label=label)


def _string(value: Any, where: str, name: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{where}: field {name!r} is a {type(value).__name__}, expected a string")
    if not value.strip():
        raise DataError(f"{where}: field {name!r} is empty; fill it in or remove the row")
    if not has_utf8_form(value):
        raise DataError(f"{where}: field {name!r} holds a lone surrogate (no UTF-8 form); fix the escape")
    return value


def _text(value: Any, where: str, name: str, assistant: bool = False) -> Text:
    if isinstance(value, list):
        return _messages(value, where, name, final=False, assistant_only=assistant)
    return _string(value, where, name)


def _messages(value: Any, where: str, name: str, final: bool, assistant_only: bool = False) -> list[Message]:
    """Validate a message list; ``final`` requires an assistant turn (something to learn from)."""
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: field {name!r} must be a non-empty list of {{role, content}} messages")
    out = []
    for i, msg in enumerate(value):
        at = f"{name}[{i}]"
        if not isinstance(msg, dict) or "role" not in msg or "content" not in msg:
            raise DataError(f"{where}: {at} must be an object with 'role' and 'content'")
        role = msg["role"]
        if role not in ROLES:
            raise DataError(f"{where}: {at}.role is {role!r}; use one of {', '.join(ROLES)}")
        if assistant_only and role != "assistant":
            raise DataError(f"{where}: {at}.role is {role!r}; {name!r} messages must be assistant turns "
                            "(put the conversation so far in 'prompt')")
        out.append({"role": role, "content": _string(msg["content"], where, f"{at}.content")})
    if final and not any(m["role"] == "assistant" for m in out):
        raise DataError(f"{where}: field {name!r} has no assistant message; there is nothing to learn from")
    return out
