"""`meshlm prepare`: documents -> tokenizer + tokenized, checksummed uint16/uint32 shards + manifest.

Two passes over the documents. Pass 1 trains the tokenizer (unless one is given) and plans the train/val split;
pass 2 tokenizes chunks of documents in worker processes and appends each document's tokens plus ``eos_id`` to
the shards of its split, in document order, so the bytes do not depend on the number of workers. Everything is
written into a hidden temp folder next to ``out_dir`` and renamed into place at the end: a crash leaves either
no dataset or a complete one. Layout and rules: docs/data.md.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from meshlm.data.corpus import CORPUS_VERSION, embedded_documents
from meshlm.data.dataset import FORMAT_VERSION, MANIFEST, TOKENIZER, ShardWriter, token_dtype
from meshlm.data.readers import ReadStats, has_utf8_form, iter_documents
from meshlm.errors import DataError
from meshlm.fileio import sha256_file
from meshlm.tokenizer import MeshTokenizer

DEFAULT_SHARD_TOKENS = 1 << 26  # 128 MiB per uint16 shard
SPLITS = ("train", "val")
EMBEDDED_SOURCE = f"meshlm embedded corpus {CORPUS_VERSION}: pydoc topics and stdlib docstrings (PSF License)"
_CHUNK_DOCS = 256  # documents per worker task; bounds memory, not results
_CHUNK_CHARS = 1 << 22


def split_position(text: str) -> float:
    """A document's place in [0, 1): the first 8 bytes of sha256(UTF-8 text); < val_fraction means val."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2.0**64


def default_cache_dir() -> Path:
    """``$MESHLM_CACHE``, else ``~/.cache/meshlm``."""
    return Path(os.environ.get("MESHLM_CACHE") or Path.home() / ".cache" / "meshlm").expanduser()


class _SplitPlan:
    """Pass 1 statistics that turn the hash rule into a split with a non-empty train (and val, if asked)."""

    def __init__(self, val_fraction: float) -> None:
        self.val_fraction = val_fraction
        self.num_docs = self.num_val = 0
        self._lowest = (2.0, -1)  # (position, index): moved to val if val is empty
        self._highest = (-1.0, -1)  # moved to train if everything landed in val
        self.forced: dict[int, str] = {}

    def observe(self, position: float) -> None:
        index = self.num_docs
        self.num_docs += 1
        self.num_val += position < self.val_fraction
        self._lowest = min(self._lowest, (position, index))
        self._highest = max(self._highest, (position, -index))

    def finish(self) -> None:
        if self.num_val == self.num_docs and self.num_docs:
            self.forced[-self._highest[1]] = "train"
        elif self.num_val == 0 and self.num_docs >= 2 and self.val_fraction > 0:
            self.forced[self._lowest[1]] = "val"

    def is_val(self, index: int, position: float) -> bool:
        return self.forced.get(index, "val" if position < self.val_fraction else "train") == "val"


# --- tokenization workers -------------------------------------------------------------------------------------
_worker_tokenizer: MeshTokenizer | None = None


def _init_worker(tokenizer_json: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already; no nested thread pools
    global _worker_tokenizer
    _worker_tokenizer = MeshTokenizer.from_str(tokenizer_json)


def _encode_chunk(texts: list[str], dtype: str, tokenizer: MeshTokenizer | None = None):
    """(concatenated tokens with an eos after each document, per-document lengths, per-document split positions)."""
    tok = tokenizer or _worker_tokenizer
    ids = tok.encode_batch(texts)
    lengths = np.array([len(x) + 1 for x in ids], dtype=np.int64)
    tokens = np.empty(int(lengths.sum()), dtype=dtype)
    ends = np.cumsum(lengths)
    for doc_ids, end, length in zip(ids, ends, lengths):
        tokens[end - length : end - 1] = doc_ids
    tokens[ends - 1] = tok.eos_id
    return tokens, lengths, np.array([split_position(t) for t in texts])


def _chunks(docs: Iterable[str]) -> Iterator[list[str]]:
    chunk, chars = [], 0
    for doc in docs:
        chunk.append(doc)
        chars += len(doc)
        if len(chunk) >= _CHUNK_DOCS or chars >= _CHUNK_CHARS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


def _encoded_chunks(docs: Iterable[str], tok: MeshTokenizer, dtype: np.dtype, num_workers: int):
    if num_workers <= 1:
        for chunk in _chunks(docs):
            yield len(chunk), _encode_chunk(chunk, dtype.str, tok)
        return
    # spawn, not fork: the parent may hold torch / tokenizers thread pools that a fork would copy half-locked.
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(num_workers, mp_context=context, initializer=_init_worker, initargs=(tok.to_str(),))
    try:
        pending: deque = deque()  # in submission order, so results are consumed in document order
        for chunk in _chunks(docs):
            pending.append((len(chunk), pool.submit(_encode_chunk, chunk, dtype.str)))
            if len(pending) >= 2 * num_workers:
                n, future = pending.popleft()
                yield n, future.result()
        while pending:
            n, future = pending.popleft()
            yield n, future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# --- the two passes -----------------------------------------------------------------------------------------------
class _Source:
    """Re-iterable documents from files or an in-memory sequence, with per-pass read statistics."""

    def __init__(self, inputs, documents, text_field: str, source: str | None) -> None:
        if isinstance(inputs, (str, os.PathLike)):
            inputs = [inputs]
        if (inputs is None or len(inputs) == 0) == (documents is None):
            raise DataError("give either input paths or documents to prepare, not both and not neither")
        self.inputs, self.text_field = inputs, text_field
        if documents is not None and not isinstance(documents, Sequence):
            documents = list(documents)  # a one-shot iterable: kept for the second pass
        self.documents = documents
        if self.documents is not None:
            self.description = {"kind": "documents", "description": source or "in-memory documents"}
        else:
            self.description = {"kind": "files", "inputs": [str(p) for p in inputs], "text_field": text_field}
        self.stats = ReadStats()

    def __iter__(self) -> Iterator[str]:
        self.stats = ReadStats()
        if self.documents is None:
            yield from iter_documents(self.inputs, self.text_field, self.stats)
            return
        for i, doc in enumerate(self.documents):
            if not isinstance(doc, str):
                raise DataError(f"document {i} is a {type(doc).__name__}, expected a string")
            if not doc:
                self.stats.skipped_empty += 1
            elif has_utf8_form(doc):
                self.stats.documents += 1
                yield doc
            else:
                self.stats.record_non_utf8(f"document {i}")


def _first_pass(source: _Source, plan: _SplitPlan, vocab_size: int | None, bar) -> MeshTokenizer | None:
    task = bar.add("reading documents" + (" and training the tokenizer" if vocab_size else ""), None)

    def observed() -> Iterator[str]:
        for doc in source:
            plan.observe(split_position(doc))
            bar.advance(task)
            yield doc

    if vocab_size is None:
        for _ in observed():
            pass
        tok = None
    else:
        tok = MeshTokenizer.train(observed(), vocab_size)
    plan.finish()
    bar.finish(task)
    if plan.num_docs == 0:
        stats = source.stats
        raise DataError(
            f"no documents to prepare in {source.description.get('inputs', 'the given documents')} "
            f"({stats.files} files read, {stats.skipped_empty} empty and {stats.skipped_non_utf8} non-UTF-8 "
            "documents skipped); point prepare at non-empty .txt/.md/.jsonl/.parquet inputs"
        )
    return tok


def _second_pass(source: _Source, plan: _SplitPlan, tok: MeshTokenizer, directory: Path, shard_tokens: int,
                 num_workers: int, bar) -> dict:  # fmt: skip
    dtype = token_dtype(tok.vocab_size)
    writers = {s: ShardWriter(directory, s, dtype, shard_tokens) for s in SPLITS}
    task = bar.add("tokenizing", plan.num_docs)
    first_index = 0
    for num_docs, (tokens, lengths, positions) in _encoded_chunks(source, tok, dtype, num_workers):
        is_val = np.array([plan.is_val(first_index + i, p) for i, p in enumerate(positions)], dtype=bool)
        token_is_val = np.repeat(is_val, lengths)
        writers["train"].add(tokens[~token_is_val], lengths[~is_val])
        writers["val"].add(tokens[token_is_val], lengths[is_val])
        first_index += num_docs
        bar.advance(task, num_docs)
    if first_index != plan.num_docs:
        raise DataError(f"inputs changed during prepare ({plan.num_docs}, then {first_index} documents); re-run it")
    return {s: w.close() for s, w in writers.items()}


class _Bar:
    """A rich progress display on an interactive stderr; silent otherwise."""

    def __init__(self, progress) -> None:
        self._progress = progress

    def add(self, description: str, total: int | None):
        return self._progress.add_task(description, total=total) if self._progress else None

    def advance(self, task, n: int = 1) -> None:
        if self._progress:
            self._progress.advance(task, n)

    def finish(self, task) -> None:
        if self._progress:
            completed = next(t.completed for t in self._progress.tasks if t.id == task)
            self._progress.update(task, total=completed)


@contextlib.contextmanager
def _progress_bar(enabled: bool) -> Iterator[_Bar]:
    if not (enabled and sys.stderr.isatty()):
        yield _Bar(None)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True)) as progress:
        yield _Bar(progress)


# --- publishing -------------------------------------------------------------------------------------------------
class OutDirExistsError(DataError):
    """``out_dir`` already holds something and ``overwrite`` was not given."""


def _check_out_dir(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"output {out_dir} is a file; choose a folder path for --out")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if not overwrite:
        raise OutDirExistsError(
            f"output folder {out_dir} already exists and is not empty; pass --overwrite or choose another --out"
        )
    if not (out_dir / MANIFEST).is_file():  # never delete a folder that is not a prepared dataset
        raise DataError(
            f"output folder {out_dir} is not empty and holds no {MANIFEST}, so it is not replaced; choose another --out"
        )


def _publish(tmp: Path, out_dir: Path, overwrite: bool) -> None:
    """Rename ``tmp`` to ``out_dir`` (an atomic rename when ``out_dir`` is absent or empty)."""
    try:
        os.rename(tmp, out_dir)
        return
    except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
    _check_out_dir(out_dir, overwrite)  # someone else filled out_dir meanwhile: same rules as at the start
    old = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(out_dir, old)
    os.rename(tmp, out_dir)
    shutil.rmtree(old)


# --- public entry points ------------------------------------------------------------------------------------------
def prepare_dataset(
    inputs: Sequence[str | os.PathLike] | None,
    out_dir: str | os.PathLike,
    *,
    documents: Iterable[str] | None = None,
    tokenizer: str | os.PathLike | MeshTokenizer | None = None,
    vocab_size: int = 8192,
    val_fraction: float = 0.01,
    num_workers: int = 2,
    text_field: str = "text",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    overwrite: bool = False,
    progress: bool = True,
    source: str | None = None,
) -> dict:
    """Tokenize ``inputs`` (paths) or ``documents`` (strings) into ``out_dir``; returns the manifest.

    Trains a byte-level BPE tokenizer of ``vocab_size`` unless ``tokenizer`` (a tokenizer.json path) is given.
    ``source`` describes in-memory ``documents`` in the manifest.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction {val_fraction} is out of range; use a value in [0, 1), e.g. 0.01")
    if not isinstance(num_workers, int) or num_workers < 0:
        raise DataError(f"num_workers {num_workers!r} is invalid; use 0 or 1 (in-process) or more worker processes")
    if not isinstance(shard_tokens, int) or shard_tokens < 1:
        raise DataError(f"shard_tokens {shard_tokens!r} is invalid; use a positive integer")
    out_dir = Path(out_dir)
    _check_out_dir(out_dir, overwrite)
    data = _Source(inputs, documents, text_field, source)
    given = None
    if tokenizer is not None:
        given = tokenizer if isinstance(tokenizer, MeshTokenizer) else MeshTokenizer.load(tokenizer)
    plan = _SplitPlan(val_fraction)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with _progress_bar(progress) as bar:
        tok = _first_pass(data, plan, None if given else vocab_size, bar) or given
        tmp.mkdir()
        try:
            tok.save(tmp / TOKENIZER)
            splits = _second_pass(data, plan, tok, tmp, shard_tokens, num_workers, bar)
            manifest = _manifest(data, plan, tok, splits, trained=given is None, requested=vocab_size,
                                 shard_tokens=shard_tokens, tokenizer_sha256=sha256_file(tmp / TOKENIZER))  # fmt: skip
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            _publish(tmp, out_dir, overwrite)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return manifest


def _manifest(data: _Source, plan: _SplitPlan, tok: MeshTokenizer, splits: dict, *, trained: bool, requested: int,
              shard_tokens: int, tokenizer_sha256: str) -> dict:  # fmt: skip
    stats = data.stats
    return {
        "format_version": FORMAT_VERSION,
        "source": data.description,
        "dtype": token_dtype(tok.vocab_size).name,
        "byte_order": "little",
        "vocab_size": tok.vocab_size,
        "requested_vocab_size": requested if trained else None,
        "tokenizer": TOKENIZER,
        "tokenizer_sha256": tokenizer_sha256,
        "tokenizer_trained": trained,
        "special_ids": tok.special_ids,
        "eos_id": tok.eos_id,
        "documents": plan.num_docs,
        "tokens": sum(s["tokens"] for s in splits.values()),
        "val_fraction": plan.val_fraction,
        "split_rule": "val if sha256(utf-8 text)[:8] / 2**64 < val_fraction; >= 1 val and >= 1 train document",
        "shard_tokens": shard_tokens,
        "splits": splits,
        "skipped_non_utf8": stats.skipped_non_utf8,
        "non_utf8_examples": stats.non_utf8_examples,
        "skipped_empty": stats.skipped_empty,
        "ignored_files": stats.ignored_files,
    }


def ensure_embedded_dataset(
    cache_dir: str | os.PathLike | None, vocab_size: int, num_workers: int = 2, *, progress: bool = True
) -> Path:
    """Prepare the embedded corpus once into ``cache_dir/embedded-{CORPUS_VERSION}-v{vocab_size}``; reuse it after.

    Safe when processes race: each builds in its own temp folder, the first rename wins, the others keep it.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out_dir = cache_dir / f"embedded-{CORPUS_VERSION}-v{vocab_size}"
    if not (out_dir / MANIFEST).is_file():
        try:
            prepare_dataset(None, out_dir, documents=embedded_documents(), vocab_size=vocab_size,
                            num_workers=num_workers, progress=progress,
                            source=EMBEDDED_SOURCE)  # fmt: skip
        except OutDirExistsError:
            if not (out_dir / MANIFEST).is_file():
                raise
    return out_dir
