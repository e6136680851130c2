"""Reading a user's JSONL file: one object per line, every mistake named by ``file:line``.

The safety commands (judge, eval safety, redteam) read small row files of their own shapes; this is their common
first step, so each of them only checks its own keys.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from meshlm.errors import DataError


def iter_jsonl(path: str | Path, what: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(where, row)`` for each non-blank line; ``what`` says what the file should hold, for the errors
    (e.g. ``"a JSONL file of {prompt, response} rows"``)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} does not exist; give {what}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8 text; give {what}") from None
    except OSError as exc:
        raise DataError(f"cannot read {path} ({exc.strerror or exc}); check the path and its permissions") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg}); one JSON object per line") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object, got a JSON {type(row).__name__}")
        yield where, row
