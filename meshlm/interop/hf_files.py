"""Files of a Hugging Face model folder: safetensors weights (single or sharded) and atomic output folders.

Weights are read with ``safetensors`` only, never with pickle (``pytorch_model.bin`` can run code when loaded).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from meshlm.errors import CheckpointError, ConfigError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path.parent} has no {path.name}; {what}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); re-save the model with save_pretrained") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object; re-save the model with save_pretrained")
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------------ reading
class SafetensorsWeights:
    """The tensors of an HF folder: name -> (file, shape, dtype), read from the file headers without loading."""

    def __init__(self, hf_dir: Path) -> None:
        from safetensors import safe_open

        self.files = _weight_files(hf_dir)
        self.entries: dict[str, tuple[Path, tuple[int, ...], str]] = {}
        for file, names in self.files.items():
            try:
                with safe_open(str(file), framework="pt") as f:
                    present = set(f.keys())
                    for name in names if names is not None else sorted(present):
                        if name not in present:
                            raise CheckpointError(f"{INDEX_FILE} places tensor '{name}' in {file.name}, which does "
                                                  "not hold it; re-save the model with save_pretrained")
                        piece = f.get_slice(name)
                        self.entries[name] = (file, tuple(piece.get_shape()), piece.get_dtype())
            except CheckpointError:
                raise
            except Exception as exc:  # safetensors raises its own SafetensorError with a Rust message
                raise CheckpointError(f"{file} is not a readable safetensors file ({exc}); re-download or "
                                      "re-save it") from None

    def read(self, name: str) -> torch.Tensor:
        """One tensor, opening its file for this read only (the file's memory map is released right after, so
        pages of the other tensors never accumulate in this process's resident memory)."""
        from safetensors import safe_open

        with safe_open(str(self.entries[name][0]), framework="pt") as f:
            return f.get_tensor(name)

    def check_float(self, name: str) -> None:
        dtype = self.entries[name][2]
        if dtype not in _FLOAT_DTYPES:
            raise CheckpointError(f"tensor '{name}' has dtype {dtype}; meshlm converts float checkpoints only "
                                  "(F32/F16/BF16), not quantized ones")


def _weight_files(hf_dir: Path) -> dict[Path, list[str] | None]:
    """file -> the tensor names the index assigns to it (None: every tensor in the file)."""
    index = hf_dir / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index, "").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index} has no 'weight_map'; re-save the model with save_pretrained")
        files: dict[Path, list[str] | None] = {}
        for name, file_name in weight_map.items():
            files.setdefault(hf_dir / str(file_name), []).append(name)
        for file in files:
            if not file.is_file():
                raise CheckpointError(f"{index} lists shard {file.name}, which is missing from {hf_dir}; download "
                                      "every shard")
        return files
    if (hf_dir / SINGLE_FILE).is_file():
        return {hf_dir / SINGLE_FILE: None}
    if any((hf_dir / n).exists() for n in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        raise CheckpointError(f"{hf_dir} has only pickle weights (pytorch_model.bin), which meshlm does not load "
                              "(unpickling can run code); re-save them with save_pretrained(safe_serialization=True)")
    raise CheckpointError(f"{hf_dir} has no weights ({SINGLE_FILE} or {INDEX_FILE} with its shards); pass the "
                          "folder written by save_pretrained")


# ------------------------------------------------------------------------------------------------ writing
def write_safetensors(tensors: dict[str, torch.Tensor], out_dir: Path, max_shard_bytes: int) -> list[str]:
    """model.safetensors, or model-0000i-of-0000n.safetensors + index when the total exceeds max_shard_bytes.

    Tensors are packed in the given order; a tensor larger than the limit gets a shard of its own (as HF does).
    Returns the file names written.
    """
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    metadata = {"format": "pt"}  # transformers refuses safetensors files without it
    if len(shards) == 1:
        save_file(shards[0], str(out_dir / SINGLE_FILE), metadata=metadata)
        return [SINGLE_FILE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for file_name, shard in zip(names, shards):
        save_file(shard, str(out_dir / file_name), metadata=metadata)
        weight_map.update({name: file_name for name in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    write_json(out_dir / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    return names + [INDEX_FILE]


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes from '5GB' (10^9, as transformers counts), '5GiB' (2^30), '500MB', '64KB' or a plain integer."""
    if isinstance(text, int):
        value, unit = float(text), "B"
    else:
        match = _SIZE.match(str(text))
        if not match:
            raise ConfigError(f"--max-shard-size {text!r}: expected a size such as 5GB, 500MB, 2GiB or a byte count")
        value, unit = float(match.group(1)), match.group(2).upper() or "B"
    base = 1024 if "I" in unit else 1000
    power = "BKMGT".index(unit[0]) if unit[0] in "KMGT" else 0
    size = int(value * base**power)
    if size < 1:
        raise ConfigError(f"--max-shard-size {text!r} must be at least one byte")
    return size


# ------------------------------------------------------------------------------------- atomic output folder
def check_output(out: Path, overwrite: bool, sources: list[Path]) -> None:
    """Refuse an existing OUT (unless overwrite) and an OUT that is, or contains, one of the inputs."""
    out_abs = out.resolve()
    for src in sources:
        src_abs = src.resolve()
        if out_abs == src_abs or out_abs in src_abs.parents:
            raise CheckpointError(f"output '{out}' would replace the input '{src}'; choose another output folder")
    if out.is_file() or out.is_symlink():
        raise CheckpointError(f"output '{out}' exists and is not a folder; choose another path")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise CheckpointError(f"output folder '{out}' already exists; pass --overwrite to replace it or choose "
                              "another path")


@contextlib.contextmanager
def atomic_folder(out: Path) -> Iterator[Path]:
    """Yield a temp folder next to ``out``; on success it replaces ``out`` by renames, on error it is deleted.

    Either the old ``out`` (or nothing) or the complete new one is there at every moment a reader looks,
    except for the instant between the two renames when replacing (the old one is then at ``.out.old-*``).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
