"""Checkpoints: DCP tensors + JSON train state + per-rank RNG, written atomically with a checksum manifest.

Layout of ``RUN_DIR/checkpoints/step-00000100/``::

    dcp/                 model and optimizer, torch.distributed.checkpoint format, keyed by parameter name
                         (the optimizer state flattened per parameter), so any layout loads any other's
    train_state.json     step, loader position, loss-scaler state, ... (global, written by rank 0)
    rng/rank-00000.pt    each rank's RNG state (tensors only; loaded with weights_only=True)
    config.toml          the resolved job config that produced it
    tokenizer.json       the tokenizer the model was trained with
    manifest.json        size and sha256 of every file above; written last

Everything is written into ``step-XXXXXXXX.tmp/`` and renamed into place only after the manifest is complete, so a
crash at any moment leaves either a complete, verifiable checkpoint or a ``.tmp`` folder that is ignored. Each file
is hashed once, by the rank that wrote it, right after writing it; rank 0 gathers the hashes into the manifest.
Replacing a folder of the same step renames the old one aside (``step-XXXXXXXX.old``) before the new one moves in
and deletes it only afterwards; an aside left by a crash counts as that step's checkpoint until replaced.

A save the file system refuses (a full disk, a folder without write permission) deletes its ``.tmp`` folder and
raises a :class:`CheckpointError` on every rank that names the checkpoint and the cause
(meshlm/checkpoint/write_failure.py): the CLI prints one line and exits 2, and the previous checkpoints are
untouched.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from meshlm.checkpoint.write_failure import describe_write_failure
from meshlm.errors import CheckpointError
from meshlm.fileio import atomic_write_text, fsync_dir, sha256_file
from meshlm.models.init import canonical_name

# Single-process runs save/load without a process group on purpose; DCP warns about that on every call.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

FORMAT = "meshlm-checkpoint"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d{8})(\.old)?$")  # .old: a replaced step set aside


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def verify_checkpoint(path: Path) -> str | None:
    """None when ``path`` is a complete checkpoint whose files match its manifest, else the reason it is not."""
    manifest_path = path / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        return "manifest.json is missing (incomplete save)"
    except (OSError, ValueError) as exc:
        return f"manifest.json is unreadable ({exc})"
    if manifest.get("format") != FORMAT:
        return "manifest.json is not a meshlm checkpoint manifest"
    for rel, meta in manifest.get("files", {}).items():
        file = path / rel
        if not file.is_file():
            return f"{rel} is missing"
        if file.stat().st_size != meta["bytes"]:
            return f"{rel} has {file.stat().st_size} bytes, manifest says {meta['bytes']} (truncated?)"
        try:
            digest = sha256_file(file)
        except OSError as exc:  # a read error (perhaps transient): not usable now, try the previous one
            return f"{rel} cannot be read ({exc})"
        if digest != meta["sha256"]:
            return f"{rel} fails its sha256 check (corrupted)"
    return None


def list_checkpoints(ckpt_root: Path) -> list[tuple[int, Path]]:
    """Finished checkpoint folders (valid or not), oldest first. A ``step-X.old`` folder (set aside by a save of
    the same step that crashed before moving its replacement in) stands for step X when ``step-X`` is absent."""
    if not ckpt_root.is_dir():
        return []
    found: dict[int, Path] = {}
    matches = [(m, p) for p in ckpt_root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    for m, p in sorted(matches, key=lambda mp: mp[0].group(2) is not None):  # finals before asides
        found.setdefault(int(m.group(1)), p)
    return sorted(found.items())


def find_latest_valid(ckpt_root: Path, warn: Callable[[str], None] = print) -> Path | None:
    """The newest checkpoint that passes verification; corrupted ones are reported and skipped."""
    for step, path in reversed(list_checkpoints(ckpt_root)):
        reason = verify_checkpoint(path)
        if reason is None:
            return path
        warn(f"checkpoint {path} is not usable: {reason}; falling back to the previous one")
    return None


def choose_resume_checkpoint(ckpt_root: Path, say: Callable[[str], None] = print) -> Path | None:
    """The checkpoint every rank resumes from: rank 0 alone verifies (hashing the files once) and broadcasts its
    choice, so no rank can pick another step after a read error of its own. Collective when distributed;
    ``say`` reports skipped checkpoints and the choice (call it on rank 0)."""
    choice: str | None = None
    if not _is_dist() or dist.get_rank() == 0:
        found = find_latest_valid(ckpt_root, warn=say)
        if found is not None:
            count = len(json.loads((found / "manifest.json").read_text())["files"])
            say(f"checkpoint {found} verified by rank 0 ({count} files, sha256); every rank resumes from it")
            choice = str(found)
    choice = _from_rank0(choice)
    return Path(choice) if choice is not None else None


def remove_unfinished(ckpt_root: Path) -> list[Path]:
    """Delete the ``step-*.tmp`` folders under ``ckpt_root`` (saves that never completed; call it only when no
    save is running) and return them."""
    stale = sorted(Path(ckpt_root).glob("step-*.tmp")) if Path(ckpt_root).is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def read_train_state(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "train_state.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path / 'train_state.json'}: {exc}") from None


class CheckpointManager:
    """Saves and restores the full training state under ``run_dir/checkpoints``."""

    def __init__(self, run_dir: Path, keep_last: int, rank: int = 0, trainable_only: bool = False) -> None:
        """``trainable_only``: save and load only the parameters that require grad (LoRA: the adapters; the
        frozen base is reloaded from its own checkpoint, which train_state.json names)."""
        self.root = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last
        self.rank = rank
        self.trainable_only = trainable_only

    def save(self, step: int, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer] | None,
             train_state: dict[str, Any], config_toml: str, extra_files: dict[str, Path] | None = None,
             planner: dcp.SavePlanner | None = None) -> Path:
        """Collective when distributed: every rank calls it. ``extra_files`` (e.g. the tokenizer) are copied in
        so the checkpoint is self-contained. ``planner``: a DCP save planner that supplies tensors lazily
        (``convert from-hf`` reads each from safetensors as it is written); each tensor then gets a DCP file of its
        own, because DCP's file writer keeps every tensor of a file alive until the file is done (torch 2.13)."""
        final = self.root / step_dir_name(step)
        tmp = self.root / (step_dir_name(step) + ".tmp")
        error, bug = None, None  # bug: this rank's unexplained exception, raised once every rank has the news
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # leftovers of a save that crashed
            error, bug = _try_write(lambda: (tmp / "rng").mkdir(parents=True), tmp)
        self._raise_if(_from_rank0(error), final, bug)  # also the barrier: the folder exists
        hashes: dict[str, dict[str, Any]] = {}
        error, bug = _try_write(lambda: hashes.update(self._write_rank_files(tmp, parts, optimizers, planner)), tmp)
        every_rank = _gather_to_rank0((hashes, error))  # also the barrier: every rank's files are written
        if self.rank == 0:
            error = next((e for _, e in every_rank if e), None)
            if error is None:
                files = {k: v for per_rank, _ in every_rank for k, v in per_rank.items()}
                error, bug = _try_write(lambda: self._write_rank0_files(tmp, step, files, train_state, config_toml,
                                                                        extra_files), tmp)
            if error is None:
                _put_in_place(tmp, final)
                self._prune(step)
            else:
                shutil.rmtree(tmp, ignore_errors=True)  # give the space back; the previous checkpoints stay
        self._raise_if(_from_rank0(error), final, bug)  # also the barrier: the checkpoint is in place
        return final

    def _write_rank_files(self, tmp: Path, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer] | None,
                          planner: dcp.SavePlanner | None) -> dict[str, dict[str, Any]]:
        """This rank's DCP shards and RNG state (collective: DCP coordinates the ranks); their manifest entries."""
        state = _PartStates(parts, optimizers, self.trainable_only)  # optimizers=None: weights only
        tensors = {"model": state.model} if state.optimizer is None else {"model": state.model,
                                                                          "optimizer": state.optimizer}
        writer = None if planner is None else dcp.FileSystemWriter(str(tmp / "dcp"), single_file_per_rank=False)
        dcp.save(tensors, checkpoint_id=str(tmp / "dcp"), no_dist=not _is_dist(), planner=planner,
                 storage_writer=writer)
        hashes = _own_dcp_hashes(tmp, self.rank)
        rng = io.BytesIO()
        torch.save(_rng_state(), rng)
        hashes[f"rng/rank-{self.rank:05d}.pt"] = _write_hashed(tmp / "rng" / f"rank-{self.rank:05d}.pt",
                                                               rng.getvalue())
        return hashes

    def _write_rank0_files(self, tmp: Path, step: int, files: dict[str, dict[str, Any]], train_state: dict[str, Any],
                           config_toml: str, extra_files: dict[str, Path] | None) -> None:
        files["train_state.json"] = _write_hashed(tmp / "train_state.json",
                                                  json.dumps({**train_state, "step": step}, indent=1).encode())
        files["config.toml"] = _write_hashed(tmp / "config.toml", config_toml.encode())
        for name, src in (extra_files or {}).items():
            files[name] = _write_hashed(tmp / name, Path(src).read_bytes())
        self._write_manifest(tmp, step, files)

    def _raise_if(self, cause: str | None, final: Path, bug: BaseException | None = None) -> None:
        """A failed save, as every rank reports it: the cause, and what is still there to resume from. A bug
        (``bug``: this rank's own exception; else the cause names another rank's) is raised as such."""
        if cause is None:
            return
        if bug is not None:
            raise bug
        if cause.startswith(_INTERNAL):
            raise RuntimeError(f"cannot write checkpoint {final}: {cause} on another rank (a bug: see its traceback)")
        previous = [path.name for step, path in list_checkpoints(self.root) if path != final]
        kept = f"the previous checkpoint {previous[-1]} is untouched" if previous else "no earlier checkpoint exists"
        raise CheckpointError(f"cannot write checkpoint {final}: {cause}; {kept}; free space (or fix the "
                              "permissions) and continue with --resume auto")

    def _write_manifest(self, folder: Path, step: int, hashed: dict[str, dict[str, Any]]) -> None:
        """``hashed``: what the writers hashed; a file nobody reported (DCP's ``.metadata``, written by the
        coordinator rank) is hashed here."""
        files = {}
        for file in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = file.relative_to(folder).as_posix()
            files[rel] = hashed.get(rel) or {"bytes": file.stat().st_size, "sha256": sha256_file(file)}
        manifest = {"format": FORMAT, "version": FORMAT_VERSION, "step": step, "files": files}
        atomic_write_text(folder / "manifest.json", json.dumps(manifest, indent=1))

    def _prune(self, saved_step: int) -> None:
        """Runs after the new checkpoint is in place. Keeps the newest ``keep_last`` of the steps up to
        ``saved_step`` (always ``saved_step`` itself) and removes leftovers. A newer step than the one just saved
        exists only when a resume fell back past it: a corrupted one is removed, a valid one is left alone, and
        neither counts toward ``keep_last`` (counting them could prune the checkpoint just written)."""
        done = list_checkpoints(self.root)
        for step, path in done:
            if step > saved_step and verify_checkpoint(path) is not None:
                shutil.rmtree(path, ignore_errors=True)
        current = [(step, path) for step, path in done if step <= saved_step]
        for _, path in current[: max(len(current) - self.keep_last, 0)]:
            shutil.rmtree(path, ignore_errors=True)
        kept = {p for _, p in list_checkpoints(self.root)}
        for stale in [*self.root.glob("step-*.tmp"), *self.root.glob("step-*.old")]:
            if stale not in kept:  # an aside whose replacement is in place
                shutil.rmtree(stale, ignore_errors=True)

    def load(self, path: Path, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
        """Restore model parts, optimizers and RNG in place from ``path``; return its train state."""
        load_weights(path, parts, optimizers, trainable_only=self.trainable_only)
        rng_file = path / "rng" / f"rank-{self.rank:05d}.pt"
        if rng_file.is_file():  # absent when resuming on more ranks than saved: those ranks keep their seed
            _set_rng_state(torch.load(rng_file, weights_only=True))
        return read_train_state(path)


_OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def tied_aliases(part: nn.Module) -> dict[str, str]:
    """State-dict key of every second name of a shared parameter -> the key of its first name (a tied output
    head: ``output.weight`` -> ``tok_embeddings.weight``). Checkpoints store such a tensor once, under the first."""
    first: dict[int, str] = {}
    aliases = {}
    for name, param in part.named_parameters(remove_duplicate=False):
        key = canonical_name(name).removeprefix("module.")
        if id(param) in first:
            aliases[key] = first[id(param)]
        else:
            first[id(param)] = key
    return aliases


class _PartStates:
    """Per-part state dicts plus their union (what DCP saves/loads: keys are parameter names, so any layout
    can load what any other layout saved). A tied parameter is listed once (:func:`tied_aliases`): saving it
    under both names doubled a tied head on disk; a checkpoint that holds both copies still loads."""

    def __init__(self, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer] | None,
                 trainable_only: bool = False, keep: Callable[[str], bool] | None = None) -> None:
        options = StateDictOptions(ignore_frozen_params=trainable_only)
        self.aliases = [tied_aliases(part) for part in parts]
        self.model_parts = [{k: v for k, v in get_model_state_dict(part, options=options).items() if k not in aliases}
                            for part, aliases in zip(parts, self.aliases)]
        if keep is not None:  # a subset of the keys (e.g. a LoRA model's base weights)
            self.model_parts = [{k: v for k, v in sd.items() if keep(k)} for sd in self.model_parts]
        self.partial = trainable_only or keep is not None
        self.optim_parts = ([get_optimizer_state_dict(part, opt, options=_OPTIM_OPTIONS)
                             for part, opt in zip(parts, optimizers)] if optimizers is not None else None)
        self.model = {k: v for sd in self.model_parts for k, v in sd.items()}
        self.optimizer = {k: v for sd in self.optim_parts for k, v in sd.items()} if self.optim_parts else None


def load_weights(path: Path, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer] | None = None, *,
                 trainable_only: bool = False, keep: Callable[[str], bool] | None = None) -> None:
    """Load model parts (and optionally their optimizers) from a checkpoint's DCP folder, resharding as needed.
    ``trainable_only`` / ``keep(key)``: load only the trainable parameters / the state-dict keys ``keep`` accepts
    (the others keep their values)."""
    states = _PartStates(parts, optimizers, trainable_only, keep)
    target: dict[str, Any] = {"model": states.model}
    if states.optimizer is not None:
        target["optimizer"] = states.optimizer
    try:
        dcp.load(target, checkpoint_id=str(path / "dcp"), no_dist=not _is_dist())
    except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
        raise CheckpointError(f"checkpoint {path} does not fit this model ({_first_line(exc)}); check that "
                              "[model] matches the run that wrote it") from None
    # dcp.load filled the merged dicts' tensors in place; they are the same objects as the per-part ones.
    for i, part in enumerate(parts):
        loaded = states.model_parts[i]
        loaded.update({alias: loaded[key] for alias, key in states.aliases[i].items() if key in loaded})
        set_model_state_dict(part, loaded, options=StateDictOptions(strict=not states.partial))
        if states.optim_parts is not None:
            set_optimizer_state_dict(part, optimizers[i], states.optim_parts[i], options=_OPTIM_OPTIONS)


def _put_in_place(tmp: Path, final: Path) -> None:
    """Move a finished ``tmp`` folder to ``final``. An existing ``final`` (a re-run of the same step) is renamed
    aside first and deleted only once the new one is in place: at every moment one complete copy of the step
    exists under a name :func:`list_checkpoints` finds."""
    aside = final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def _write_hashed(path: Path, data: bytes) -> dict[str, Any]:
    """Write ``data`` (fsynced) and return its manifest entry, hashed from the bytes in memory."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _own_dcp_hashes(folder: Path, rank: int) -> dict[str, dict[str, Any]]:
    """Manifest entries of the DCP shards this rank just wrote (DCP's file system writer names them
    ``__<rank>_<n>.distcp``), read back once while they are still in the page cache."""
    out = {}
    for file in sorted((folder / "dcp").glob(f"__{rank}_*")):
        out[f"dcp/{file.name}"] = {"bytes": file.stat().st_size, "sha256": sha256_file(file)}
    return out


_INTERNAL = "internal error: "  # the cause another rank is sent for a failure the file system does not explain


def _try_write(write: Callable[[], Any], folder: Path) -> tuple[str | None, BaseException | None]:
    """Run ``write``: (None, None) when it succeeds, else (the file-system cause of its failure, None). A failure the
    file system does not explain is a bug: ("internal error: TypeName", the exception), sent through the same
    collective as a cause and raised after it (raised at once, it left the other ranks waiting there)."""
    try:
        write()
    except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
        cause = describe_write_failure(exc, folder)
        if cause is None:
            return _INTERNAL + type(exc).__name__, exc
        return cause, None
    return None, None


def _from_rank0(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (a barrier when distributed)."""
    if not _is_dist():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather_to_rank0(obj: Any) -> list[Any]:
    """Every rank's ``obj`` on rank 0 (a list by rank; other ranks get [])."""
    if not _is_dist():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
    dist.gather_object(obj, out if dist.get_rank() == 0 else None, dst=0)
    return out


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[-1][:300] if text else type(exc).__name__


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
