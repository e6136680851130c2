"""The on-disk format of a prepared dataset: shards written by :class:`ShardWriter`, read back by :class:`TokenDataset`.

A dataset folder holds ``manifest.json``, ``tokenizer.json`` and, per split, raw little-endian token shards
``{split}-00000.bin``... (no header: ``np.memmap`` reads them). The manifest records each shard's token count,
document count and sha256; :class:`TokenDataset` refuses a shard whose size or checksum differs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from meshlm.errors import DataError
from meshlm.fileio import sha256_file

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
_REPREPARE = "re-run `meshlm prepare`"


def token_dtype(vocab_size: int) -> np.dtype:
    """Little-endian uint16 when every id fits in 16 bits (vocab_size <= 65536), else uint32."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")




class ShardWriter:
    """Appends token runs to ``{split}-00000.bin``... of ``shard_tokens`` tokens each; documents may span shards."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int) -> None:
        self.directory, self.split, self.dtype, self.shard_tokens = directory, split, dtype, shard_tokens
        self.shards: list[dict] = []
        self.tokens = self.documents = 0
        self._file = None

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append whole documents: ``tokens`` is their concatenation, ``lengths`` their sizes (eos included)."""
        ends = self.tokens + np.cumsum(lengths)  # global exclusive end of each document
        self.documents += len(lengths)
        pos = 0
        while pos < len(tokens):
            if self._file is None:
                self._open()
            piece = tokens[pos : pos + self.shard_tokens - self._shard["tokens"]]
            start = self.tokens
            raw = piece.astype(self.dtype, copy=False).tobytes()
            self._file.write(raw)
            self._hash.update(raw)
            self.tokens += len(piece)
            self._shard["tokens"] += len(piece)
            # A document is counted in the shard that holds its eos (its last token).
            ended = np.searchsorted(ends, self.tokens, "right") - np.searchsorted(ends, start, "right")
            self._shard["documents"] += int(ended)
            pos += len(piece)
            if self._shard["tokens"] == self.shard_tokens:
                self._close_shard()

    def close(self) -> dict:
        if self._file is not None:
            self._close_shard()
        return {"documents": self.documents, "tokens": self.tokens, "shards": self.shards}

    def _open(self) -> None:
        name = f"{self.split}-{len(self.shards):05d}.bin"
        self._file = open(self.directory / name, "wb")
        self._hash = hashlib.sha256()
        self._shard = {"file": name, "tokens": 0, "documents": 0, "sha256": ""}

    def _close_shard(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        self._shard["sha256"] = self._hash.hexdigest()
        self.shards.append(self._shard)


class TokenStream:
    """The tokens of one split, its shards read as a single 1-D sequence without copying them into memory."""

    def __init__(self, name: str, shards: list[np.ndarray]) -> None:
        self.name = name
        self.shards = shards
        self._starts = np.cumsum([0] + [len(s) for s in shards])  # (num_shards + 1,) global offsets

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index: slice) -> np.ndarray:
        """A copy of ``tokens[start:stop]`` (step 1 only), gathered across shard boundaries."""
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("TokenStream supports contiguous slices only, e.g. tokens[a:b]")
        start, stop, _ = index.indices(len(self))
        return self.read(start, max(stop - start, 0))

    def read(self, start: int, length: int) -> np.ndarray:
        if start < 0 or length < 0 or start + length > len(self):
            raise IndexError(f"tokens [{start}, {start + length}) lie outside split {self.name!r} ({len(self)} tokens)")
        out = np.empty(length, dtype=self.shards[0].dtype if self.shards else np.uint16)
        filled = 0
        shard = int(np.searchsorted(self._starts, start, "right")) - 1
        while filled < length:
            offset = start + filled - int(self._starts[shard])
            piece = self.shards[shard][offset : offset + length - filled]
            out[filled : filled + len(piece)] = piece
            filled += len(piece)
            shard += 1
        return out


class TokenDataset:
    """The output folder of ``prepare_dataset``; every shard is size-checked and, with ``verify``, checksummed."""

    def __init__(self, path: str | os.PathLike, verify: bool = True) -> None:
        self.path = Path(path)
        self.manifest = _read_manifest(self.path / MANIFEST)
        self.dtype = token_dtype(self.vocab_size)
        if self.manifest["dtype"] != self.dtype.name:
            raise DataError(
                f"{self.path / MANIFEST}: dtype {self.manifest['dtype']!r} does not fit vocab_size {self.vocab_size}; "
                + _REPREPARE
            )
        if verify:
            _check_sha256(self.tokenizer_path, self.manifest["tokenizer_sha256"], "tokenizer")
        self._splits = {
            name: TokenStream(name, [self._open_shard(s, verify) for s in split["shards"]])
            for name, split in self.manifest["splits"].items()
        }

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def eos_id(self) -> int:
        return int(self.manifest["eos_id"])

    @property
    def tokenizer_path(self) -> Path:
        return self.path / self.manifest["tokenizer"]

    @property
    def split_names(self) -> list[str]:
        return list(self._splits)

    def split(self, name: str) -> TokenStream:
        if name not in self._splits:
            raise DataError(f"dataset {self.path} has no split {name!r}; available: {', '.join(self._splits)}")
        return self._splits[name]

    def fingerprint(self, split: str) -> str:
        """A short id of a split's exact tokens (from the shard checksums), stored in loader state."""
        shas = "".join(s["sha256"] for s in self.manifest["splits"][split]["shards"])
        return hashlib.sha256(shas.encode()).hexdigest()[:16]

    def _open_shard(self, shard: dict, verify: bool) -> np.ndarray:
        file = self.path / shard["file"]
        expected = int(shard["tokens"]) * self.dtype.itemsize
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            raise DataError(f"shard {file} is missing; {_REPREPARE}") from None
        if size != expected:
            raise DataError(f"shard {file} is corrupted (size {size} bytes, expected {expected}); {_REPREPARE}")
        if verify:
            _check_sha256(file, shard["sha256"], "shard")
        if expected == 0:
            return np.empty(0, dtype=self.dtype)
        return np.memmap(file, dtype=self.dtype, mode="r")


def _read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        hint = f"prepare a dataset first: `meshlm prepare INPUT... --out {path.parent}`"
        raise DataError(f"{path} not found; {hint}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path} is not a readable JSON manifest ({e}); {_REPREPARE}") from e
    if not isinstance(manifest, dict):
        raise DataError(f"{path} is not a meshlm manifest (expected a JSON object); {_REPREPARE}")
    if manifest.get("format_version") != FORMAT_VERSION:
        version = manifest.get("format_version")
        raise DataError(f"{path} has format_version {version!r}, this meshlm reads {FORMAT_VERSION}; {_REPREPARE}")
    required = ("dtype", "vocab_size", "eos_id", "tokenizer", "tokenizer_sha256", "splits")
    missing = [k for k in required if k not in manifest]
    if missing:
        raise DataError(f"{path} lacks the keys {missing}; {_REPREPARE}")
    return manifest


def _check_sha256(file: Path, expected: str, what: str) -> None:
    try:
        actual = sha256_file(file)
    except FileNotFoundError:
        raise DataError(f"{what} {file} is missing; {_REPREPARE}") from None
    if actual != expected:
        raise DataError(f"{what} {file} is corrupted (checksum mismatch); {_REPREPARE}")
