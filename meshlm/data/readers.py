"""Read documents from text, JSON Lines and Parquet files, or folders of them.

Formats, chosen by extension:
- ``.txt``, ``.md`` or no extension: the whole file is one document (bytes decoded as UTF-8, line endings kept).
- ``.jsonl``, ``.json``: JSON Lines, one object per line, the document in field ``text_field``; blank lines are
  allowed; a line that is not JSON, not an object, or lacks the field is a :class:`DataError` naming file:line.
- ``.parquet``: one document per row of column ``text_field`` (string or binary); null rows are skipped.
- a folder: every file with one of the extensions above, recursively, in sorted path order; hidden files and
  folders (name starting with ".") and other extensions are ignored.

Non-UTF-8 policy: a document that is not valid UTF-8 (a whole text file, one JSONL line, one Parquet value,
or a JSON string holding a lone surrogate) is skipped and counted in :class:`ReadStats`, never repaired with
replacement characters. A leading UTF-8 byte-order mark is dropped. Empty documents are skipped and counted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from meshlm.errors import DataError

TEXT_SUFFIXES = frozenset({".txt", ".md", ""})
JSONL_SUFFIXES = frozenset({".jsonl", ".json"})
PARQUET_SUFFIXES = frozenset({".parquet"})
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | JSONL_SUFFIXES | PARQUET_SUFFIXES
_BOM = "\ufeff"
_MAX_EXAMPLES = 5
_PARQUET_BATCH_ROWS = 1024


@dataclass
class ReadStats:
    """What a pass over the inputs read and skipped (filled in while iterating)."""

    files: int = 0
    documents: int = 0
    skipped_non_utf8: int = 0
    skipped_empty: int = 0
    ignored_files: int = 0  # files in folders with an unsupported extension
    non_utf8_examples: list[str] = field(default_factory=list)  # first few "file:line" locations

    def record_non_utf8(self, where: str) -> None:
        self.skipped_non_utf8 += 1
        if len(self.non_utf8_examples) < _MAX_EXAMPLES:
            self.non_utf8_examples.append(where)


def iter_documents(
    paths: Sequence[str | os.PathLike], text_field: str = "text", stats: ReadStats | None = None
) -> Iterator[str]:
    """Yield the documents of ``paths`` in order (see the module docstring for formats and policies)."""
    stats = stats if stats is not None else ReadStats()
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    for path in paths:
        for file in _expand(Path(path), stats):
            stats.files += 1
            for doc in _read_file(file, text_field, stats):
                if doc:
                    stats.documents += 1
                    yield doc
                else:
                    stats.skipped_empty += 1


def _expand(path: Path, stats: ReadStats) -> list[Path]:
    if path.is_dir():
        files = []
        for root, dirs, names in os.walk(path, onerror=_raise_walk_error):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in names:
                if name.startswith("."):
                    continue
                if Path(name).suffix.lower() in SUPPORTED_SUFFIXES - {""}:
                    files.append(Path(root, name))
                else:
                    stats.ignored_files += 1
        return sorted(files, key=lambda p: p.relative_to(path).as_posix())
    if not path.exists():
        raise DataError(f"input {path} does not exist; check the path")
    if path.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise DataError(
            f"input {path} has unsupported type {path.suffix!r}; use .txt, .md, .jsonl, .json (JSON Lines), "
            ".parquet or a folder of them"
        )
    return [path]


def _raise_walk_error(error: OSError) -> None:
    raise DataError(f"cannot list folder {error.filename} ({error.strerror or error}); check its permissions")


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read input {path} ({e.strerror or e}); check its permissions") from e


def _read_file(path: Path, text_field: str, stats: ReadStats) -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        yield from _read_jsonl(path, text_field, stats)
    elif suffix in PARQUET_SUFFIXES:
        yield from _read_parquet(path, text_field, stats)
    else:
        try:
            yield _decode(_read_bytes(path))
        except UnicodeDecodeError:
            stats.record_non_utf8(str(path))


def _decode(raw: bytes) -> str:
    text = raw.decode("utf-8")  # strict: raises on any invalid sequence
    return text[1:] if text.startswith(_BOM) else text


def _read_jsonl(path: Path, text_field: str, stats: ReadStats) -> Iterator[str]:
    for lineno, raw in enumerate(_read_bytes(path).split(b"\n"), start=1):
        where = f"{path}:{lineno}"
        try:
            line = _decode(raw) if lineno == 1 else raw.decode("utf-8")
        except UnicodeDecodeError:
            stats.record_non_utf8(where)
            continue
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{where}: invalid JSON ({e.msg} at column {e.colno}); .jsonl/.json inputs need one JSON object "
                "per line: fix or remove the line"
            ) from e
        if not isinstance(record, dict) or text_field not in record:
            raise DataError(
                f"{where}: no {text_field!r} field in this line; pass --text-field NAME to pick the field "
                "holding the text"
            )
        text = record[text_field]
        if text is None:
            yield ""
            continue
        if not isinstance(text, str):
            raise DataError(f"{where}: field {text_field!r} is a {type(text).__name__}, expected a string")
        if has_utf8_form(text):
            yield text
        else:
            stats.record_non_utf8(where)


def has_utf8_form(text: str) -> bool:
    """False when ``text`` holds a lone surrogate (possible via JSON escapes) and so has no UTF-8 form."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _read_parquet(path: Path, text_field: str, stats: ReadStats) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"cannot read Parquet file {path} ({e}); check that it is a valid .parquet file") from e
    schema = parquet.schema_arrow
    if text_field not in schema.names:
        raise DataError(
            f"{path}: no column {text_field!r} (columns: {', '.join(schema.names)}); pass --text-field NAME"
        )
    column_type = schema.field(text_field).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)
            or pa.types.is_binary(column_type) or pa.types.is_large_binary(column_type)):  # fmt: skip
        raise DataError(f"{path}: column {text_field!r} has type {column_type}, expected string")
    row = 0
    for batch in parquet.iter_batches(columns=[text_field], batch_size=_PARQUET_BATCH_ROWS):
        # Decode ourselves from raw bytes so that invalid UTF-8 follows the skip-and-count policy.
        for value in batch.column(0).cast(pa.large_binary()).to_pylist():
            row += 1
            if value is None:
                yield ""
                continue
            try:
                yield value.decode("utf-8")
            except UnicodeDecodeError:
                stats.record_non_utf8(f"{path}:row {row}")
