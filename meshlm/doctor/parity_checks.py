"""The causes of "multi-device results differ from single-device", each checked by name from what the ranks did.

``diagnostics.parity_probe`` makes every rank of a run write ``parity_probe.rank<R>.json`` (:class:`ParityProbe`):
the SHA-256 of every parameter's full value as training starts, the state of the global RNG the dropout masks
are drawn from, the dropout modules and their rates, and — read from the rank's own loader object — the global
samples it read in each step and the windows its shard holds over one epoch. ``meshlm diagnose parity`` runs the
layout and the single-device reference with the probe on and compares (:func:`run_checks`):

- ``init_matches_single_device``: every rank starts from the single device's values (the seed is the same where
  it must be); ``init_covers_model``: the ranks together hold every parameter of the model;
- ``data_shards_disjoint``: in each step, ranks with different data-parallel coordinates read disjoint samples
  and tensor/pipeline peers read the same ones; ``data_covers_batch``: together they read exactly the reference's
  global batch; ``data_epoch_partition``: over one epoch the ranks' shards are disjoint and cover every window;
- ``dropout_settings``: dropout modules with p > 0 (masks cannot match a single device step for step);
  ``dropout_rng_streams``: data-parallel ranks drawing from identical RNG streams (the seed is the same where
  it should differ: every rank applies the same masks to different samples).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from meshlm.data import SequenceLoader
from meshlm.fileio import atomic_write_text
from meshlm.models.init import canonical_name
from meshlm.planner.measure import mesh_coords
from meshlm.train.callbacks import TrainerCallback, TrainerView

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"


def _plain(name: str) -> str:
    """A name without DDP's ``module.`` prefix (the single device's name)."""
    return name[len("module."):] if name.startswith("module.") else name


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()


class ParityProbe(TrainerCallback):
    """Records one rank's starting point and data (a trainer callback: on when ``diagnostics.parity_probe`` is)."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.record: dict[str, Any] = {}

    def on_init(self, view: TrainerView) -> None:
        engine = view.engine
        self.path = Path(view.run_dir) / f"parity_probe.rank{engine.rank}.json"
        params: dict[str, str] = {}
        with torch.no_grad():
            for part in view.model_parts:
                for name, p in part.named_parameters():
                    full = p.full_tensor() if hasattr(p, "full_tensor") else p  # DTensor: gathered over its mesh
                    params[_plain(canonical_name(name))] = _sha(full)
        rng = [hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()]
        if view.device.type == "cuda":
            rng.append(hashlib.sha256(torch.cuda.get_rng_state(view.device).numpy().tobytes()).hexdigest())
        dropout = [{"module": _plain(canonical_name(n)), "p": m.p} for part in view.model_parts
                   for n, m in part.named_modules() if isinstance(m, nn.Dropout) and m.p > 0]
        self.record: dict[str, Any] = {
            "rank": engine.rank, "coords": mesh_coords(engine), "dp_rank": engine.dp_rank, "dp_size": engine.dp_size,
            "seed": view.cfg.training.seed, "params": params, "rng": "/".join(rng), "dropout": dropout,
            "loader": type(view.train_loader).__name__, "steps": [], "epoch": None}
        loader = view.train_loader
        if isinstance(loader, SequenceLoader):
            self.record["epoch"] = _epoch_shard(loader)
            fetch = loader.next_batch

            def next_batch() -> dict[str, torch.Tensor]:  # the samples this very call reads
                self.record["steps"].append({"step": view.step + 1, "samples": list(loader.batch_samples())})
                self._write()
                return fetch()

            loader.next_batch = next_batch
        self._write()

    def _write(self) -> None:
        atomic_write_text(self.path, json.dumps(self.record))


def _epoch_shard(loader) -> dict[str, Any]:
    """The windows this rank's loader reads for global samples 0 .. n-1 (one epoch), from its own indices."""
    n, g = loader.num_windows, loader.global_batch_size
    samples, windows = [], []
    for start in range(0, n, g):
        for s in loader.batch_samples(start):
            if s < n:
                samples.append(s)
                windows.append(loader.window_of(s))
    return {"num_windows": n, "samples": samples, "windows": windows}


def read_probes(run_dir: Path) -> list[dict[str, Any]]:
    files = sorted(Path(run_dir).glob("parity_probe.rank*.json"), key=lambda p: int(p.stem.split("rank")[-1]))
    return [json.loads(p.read_text()) for p in files]


# ------------------------------------------------------------------------------------------------- checks
def check(name: str, status: str, detail: str) -> dict[str, str]:
    return {"name": name, "status": status, "detail": detail}


def init_checks(reference: dict[str, Any], ranks: list[dict[str, Any]]) -> list[dict[str, str]]:
    ref = dict(reference["params"])
    if "tok_embeddings.weight" in ref and "output.weight" not in ref:  # tied: a pipelined last stage's own copy
        ref["output.weight"] = ref["tok_embeddings.weight"]
    wrong = sorted({f"{n} (rank {r['rank']})" for r in ranks for n, h in r["params"].items()
                    if n in ref and ref[n] != h})
    held = {n for r in ranks for n in r["params"]}
    missing = sorted(set(reference["params"]) - held)
    extra = sorted(held - set(ref))
    compared = sum(1 for r in ranks for n in r["params"] if n in ref)
    out = [check("init_matches_single_device", FAIL if wrong else PASS,
                 f"{len(wrong)} of {compared} rank parameters start from other values than the single device "
                 f"(seed {reference['seed']}): {', '.join(wrong[:6])}" if wrong else
                 f"all {compared} parameters on {len(ranks)} ranks equal the single device's initial values "
                 f"(SHA-256 of the full tensors)")]
    detail = (f"no rank holds {', '.join(missing[:6])}" if missing else
              f"the ranks hold all {len(reference['params'])} parameters of the model")
    if extra:
        detail += f"; not in the single-device model (not compared): {', '.join(extra[:4])}"
    out.append(check("init_covers_model", FAIL if missing else PASS, detail))
    return out


def data_checks(reference: dict[str, Any], ranks: list[dict[str, Any]]) -> list[dict[str, str]]:
    if reference.get("epoch") is None or any(r.get("epoch") is None for r in ranks):
        why = f"the {ranks[0]['loader'] if ranks else '?'} loader does not expose the samples it reads"
        return [check(n, SKIP, why) for n in ("data_shards_disjoint", "data_covers_batch", "data_epoch_partition")]
    by_step: dict[int, dict[int, set[int]]] = defaultdict(dict)
    peers_differ, overlaps, coverage = [], [], []
    for r in ranks:
        for s in r["steps"]:
            mine = set(s["samples"])
            seen = by_step[s["step"]].get(r["dp_rank"])
            if seen is not None and seen != mine:
                peers_differ.append(f"step {s['step']} rank {r['rank']}")
            by_step[s["step"]].setdefault(r["dp_rank"], mine)
    ref_steps = {s["step"]: set(s["samples"]) for s in reference["steps"]}
    for step, shards in sorted(by_step.items()):
        items = sorted(shards.items())
        for i, (a, sa) in enumerate(items):
            for b, sb in items[i + 1:]:
                if sa & sb:
                    overlaps.append(f"step {step}: dp ranks {a} and {b} share {len(sa & sb)} samples")
        union = set().union(*shards.values())
        if step in ref_steps and union != ref_steps[step]:
            coverage.append(f"step {step}: {len(ref_steps[step] - union)} samples of the global batch unread, "
                            f"{len(union - ref_steps[step])} read that the single device did not")
    steps = len(by_step)
    bad = overlaps + [f"tensor/pipeline peers read different samples ({', '.join(peers_differ[:3])})"] * bool(
        peers_differ)
    out = [check("data_shards_disjoint", FAIL if bad else PASS, "; ".join(bad[:4]) if bad else
                 f"{steps} steps: the {len({r['dp_rank'] for r in ranks})} data-parallel shards are disjoint and "
                 f"tensor/pipeline peers read the same samples"),
           check("data_covers_batch", FAIL if coverage or not steps else PASS, "; ".join(coverage[:4]) if coverage
                 else f"{steps} steps: the shards together are exactly the single device's global batches")]
    out.append(_epoch_check(ranks))
    return out


def _epoch_check(ranks: list[dict[str, Any]]) -> dict[str, str]:
    shards = {r["dp_rank"]: r["epoch"] for r in ranks}
    n = next(iter(shards.values()))["num_windows"]
    counts: dict[int, int] = defaultdict(int)
    for shard in shards.values():
        for w in shard["windows"]:
            counts[w] += 1
    repeated = sum(1 for c in counts.values() if c > 1)
    unread = n - sum(1 for w in counts if 0 <= w < n)
    if repeated or unread:
        return check("data_epoch_partition", FAIL, f"over one epoch of {n} windows: {repeated} read by more than "
                     f"one rank, {unread} read by none")
    sizes = ", ".join(str(len(shards[k]["windows"])) for k in sorted(shards))
    return check("data_epoch_partition", PASS, f"over one epoch the {len(shards)} shards ({sizes} windows) are "
                 f"disjoint and cover all {n} windows")


def dropout_checks(ranks: list[dict[str, Any]]) -> list[dict[str, str]]:
    active = {d["module"]: d["p"] for r in ranks for d in r["dropout"]}
    if not active:
        streams = len({r["rng"] for r in ranks})
        return [check("dropout_settings", PASS, "no dropout module with p > 0: training draws no random masks"),
                check("dropout_rng_streams", PASS, f"no dropout, so the {streams} distinct RNG stream(s) over "
                      f"{len(ranks)} ranks do not affect training")]
    names = ", ".join(f"{m} p={p:g}" for m, p in list(active.items())[:4]) + (", ..." if len(active) > 4 else "")
    out = [check("dropout_settings", WARN, f"{len(active)} dropout modules are active ({names}): "
                 "a parallel layout draws other masks than one device, so per-step parity is not expected; set "
                 "the rates to 0 (e.g. lora.dropout=0) to check parity")]
    by_stream: dict[str, set[int]] = defaultdict(set)
    for r in ranks:
        by_stream[r["rng"]].add(r["dp_rank"])
    shared = [sorted(dps) for dps in by_stream.values() if len(dps) > 1]
    if shared:
        out.append(check("dropout_rng_streams", WARN, f"data-parallel ranks {shared[0]} start from the same RNG "
                         "state (one seed on every rank): they apply identical dropout masks to different samples; "
                         "offset the dropout seed by the data-parallel rank for independent masks"))
    else:
        out.append(check("dropout_rng_streams", PASS, "every data-parallel rank draws its dropout masks from its "
                         "own RNG stream"))
    return out


def run_checks(reference_dir: Path, layout_dir: Path) -> list[dict[str, str]]:
    refs, ranks = read_probes(reference_dir), read_probes(layout_dir)
    if not refs or not ranks:
        return [check("probe", FAIL, f"no parity probe was written in {reference_dir if not refs else layout_dir}")]
    return [*init_checks(refs[0], ranks), *data_checks(refs[0], ranks), *dropout_checks(ranks)]
