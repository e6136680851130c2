"""Reading a GGUF file: its metadata, its tensor index, and one tensor at a time.

Why not ``gguf.GGUFReader``: it memory-maps the whole file and keeps a numpy view per metadata item — for a
49,152-token vocabulary and its merges that is ~200k small arrays (about 170 MB and tens of seconds on these
CPUs, before any weight is read) and every page of weights it touches stays in the process's resident memory.
This parser reads the metadata with ``struct`` and each tensor's bytes with a plain ``read``; dequantisation is
the ``gguf`` package's (``gguf.quants.dequantize``). Layout (version 2 and 3, little-endian): magic ``GGUF``,
version, tensor count, key/value count, the key/values, the tensor infos (name, dims innermost first, type,
offset), padding to ``general.alignment`` (32), then the tensor data.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from meshlm.errors import CheckpointError
from meshlm.interop.gguf_names import from_interleaved

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_CHUNK_VALUES = 1 << 22  # values dequantised at once (16 MB of fp32)
# GGUF value type -> struct format of a scalar (8 is a string, 9 an array).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
          12: "<f8"}


class _Truncated(Exception):
    pass


class _Stream:
    """Little-endian reads from a file, raising _Truncated when it ends early."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def bytes(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise _Truncated
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.bytes(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.bytes(self.scalar("<Q")).decode("utf-8")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item in _NUMPY:  # numbers in one read
                size = np.dtype(_NUMPY[item]).itemsize
                return np.frombuffer(self.bytes(size * count), dtype=_NUMPY[item]).tolist()
            return [self.value(item) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {vtype}")


class GGUFFile:
    """The metadata (``meta``: key -> value), tensor index and tensors of a GGUF file; :meth:`read` dequantises
    one tensor to fp32, putting q/k rows marked with :meth:`unpermute` back into meshlm's order and shifting the
    weights marked with :meth:`shift`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"GGUF file '{self.path}' does not exist (or is not a file); pass a .gguf model "
                                  "file")
        self.meta: dict[str, Any] = {}
        self.tensors: dict[str, tuple[tuple[int, ...], Any, int, int]] = {}  # name -> (shape, type, offset, bytes)
        self._heads: dict[str, int] = {}
        self._shifts: dict[str, float] = {}
        with open(self.path, "rb") as f:
            try:
                self._parse(_Stream(f))
            except _Truncated:
                raise CheckpointError(f"{self.path} is truncated (it ends inside its header); download or copy "
                                      "the file again") from None
            except (ValueError, UnicodeDecodeError, struct.error) as exc:
                raise CheckpointError(f"{self.path} is damaged ({exc}); download or copy the file again") from None
            end = f.seek(0, 2)
        for name, (_, _, offset, nbytes) in self.tensors.items():
            if offset + nbytes > end:
                raise CheckpointError(f"{self.path} is truncated: tensor '{name}' ends at byte {offset + nbytes:,} "
                                      f"but the file has {end:,}; download or copy the file again")

    def _parse(self, s: _Stream) -> None:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        magic = s.f.read(4)
        if magic != GGUF_MAGIC:
            raise CheckpointError(f"{self.path} is not a GGUF file (it does not start with the bytes 'GGUF'); pass "
                                  "a .gguf model file (for a Hugging Face folder use `meshlm convert from-hf`)")
        version = s.scalar("<I")
        if version not in (2, 3):
            raise CheckpointError(f"{self.path}: GGUF version {version} is not supported (2 and 3 are; a big-endian "
                                  "file reads as a huge version)")
        n_tensors, n_kv = s.scalar("<Q"), s.scalar("<Q")
        for _ in range(n_kv):
            key = s.string()
            self.meta[key] = s.value(s.scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = s.string()
            dims = [s.scalar("<Q") for _ in range(s.scalar("<I"))]
            infos.append((name, dims, s.scalar("<I"), s.scalar("<Q")))
        align = self.meta.get("general.alignment", DEFAULT_ALIGNMENT)
        start = -(-s.f.tell() // align) * align
        for name, dims, raw_type, offset in infos:
            try:
                qtype = GGMLQuantizationType(raw_type)
            except ValueError:
                raise CheckpointError(f"{self.path}: tensor '{name}' has type number {raw_type}, unknown to the "
                                      "installed gguf package; upgrade it (pip install -U gguf)") from None
            block, size = GGML_QUANT_SIZES[qtype]
            if dims and dims[0] % block:
                raise CheckpointError(f"{self.path}: tensor '{name}' has rows of {dims[0]} values, not a multiple "
                                      f"of its {qtype.name} block of {block}; the file is damaged")
            n = int(np.prod(dims)) if dims else 1
            self.tensors[name] = (tuple(reversed(dims)), qtype, start + offset, n * size // block)

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape in PyTorch order (GGUF lists dimensions innermost first)."""
        return self.tensors[name][0]

    def type_name(self, name: str) -> str:
        return self.tensors[name][1].name

    def qtype(self, name: str):
        return self.tensors[name][1]

    def unpermute(self, name: str, n_heads: int) -> None:
        """Mark a q/k weight whose rows llama.cpp interleaved (:mod:`meshlm.interop.gguf_names`)."""
        self._heads[name] = n_heads

    def shift(self, name: str, offset: float) -> None:
        """Mark a tensor to be read with ``offset`` added (Gemma's norms: llama.cpp stores 1 + w, meshlm w)."""
        self._shifts[name] = offset

    def read(self, name: str) -> torch.Tensor:
        """One tensor in fp32, in meshlm's row order (read with ``read``, so no page of the file stays mapped)."""
        from gguf.quants import dequantize, quant_shape_to_byte_shape

        shape, qtype, offset, nbytes = self.tensors[name]
        with open(self.path, "rb") as f:
            f.seek(offset)
            raw = np.frombuffer(f.read(nbytes), dtype=np.uint8)
        raw = raw.reshape(-1, quant_shape_to_byte_shape(shape or (1,), qtype)[-1])
        values = np.empty((raw.shape[0], (shape or (1,))[-1]), dtype=np.float32)
        step = max(1, _CHUNK_VALUES // values.shape[1])  # dequantising makes temporaries several times the output
        for start in range(0, raw.shape[0], step):
            values[start:start + step] = dequantize(raw[start:start + step], qtype)
        out = torch.from_numpy(values.reshape(shape))
        if name in self._heads:
            out = from_interleaved(out, self._heads[name])
        if name in self._shifts:
            out += self._shifts[name]  # in fp32, as transformers' loader subtracts (its Gemma2TensorProcessor)
        return out
