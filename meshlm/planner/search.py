"""Enumerate the layouts of a cluster, evaluate each (memory, step time), keep those that fit, rank them by
predicted throughput, and say why each family that did not make it was rejected."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from meshlm.errors import ConfigError
from meshlm.planner.hardware import Hardware
from meshlm.planner.layout import AC_MODES, SCHEDULES, Layout, Training
from meshlm.planner.memory import GIB, Memory, memory
from meshlm.planner.model_spec import ModelSpec
from meshlm.planner.timing import StepTime, step_time

DEFAULT_HEADROOM = 0.9  # of device memory usable by tensors (allocator fragmentation, context, comm buffers)


@dataclass
class Evaluation:
    layout: Layout
    memory: Memory
    time: StepTime | None = None
    feasible: bool = False
    reason: str = ""
    gpus: int = 1

    @property
    def tokens_per_s(self) -> float:
        return self.time.detail.get("tokens", 0.0) / self.time.step_time_s if self.time else 0.0

    def to_json(self, training: Training, hw: Hardware) -> dict[str, Any]:
        out: dict[str, Any] = {"layout": self.layout.to_json(training), "family": self.layout.family(),
                               "memory_gib": self.memory.gib(), "feasible": self.feasible}
        if self.time is not None:
            t = self.time
            out.update(step_time_s=t.step_time_s, tokens_per_s=self.tokens_per_s,
                       tokens_per_s_per_gpu=self.tokens_per_s / self.gpus,
                       mfu=t.model_flops / (t.step_time_s * self.gpus * hw.peak(training.precision)),
                       hfu=t.hardware_flops / (t.step_time_s * self.gpus * hw.peak(training.precision)),
                       comm_share=min(t.comm_s / t.step_time_s, 1.0),
                       exposed_comm_share=t.exposed_comm_s / t.step_time_s,
                       bubble=t.bubble_s / t.step_time_s,
                       time_s={"compute": t.compute_s, "tp_comm": t.tp_comm_s, "pp_p2p": t.p2p_s,
                               "dp_comm": t.dp_comm_s, "dp_exposed": t.dp_exposed_s, "bubble": t.bubble_s})
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass
class SearchResult:
    recommended: Evaluation | None
    candidates: list[Evaluation]
    rejected: dict[str, Evaluation] = field(default_factory=dict)  # family -> its closest attempt
    evaluated: int = 0
    fitting: list[Evaluation] = field(default_factory=list)  # the best of every layout group that fits


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def validity(spec: ModelSpec, layout: Layout, training: Training) -> str:
    """Why the engine cannot run this layout ('' when it can)."""
    t = layout.tp
    if t > 1:
        for name in ("n_heads", "n_kv_heads", "ffn_hidden_dim"):
            if getattr(spec, name) % t:
                return f"{name} ({getattr(spec, name)}) is not divisible by tp {t}"
    if layout.pp > 1:
        if spec.n_layers < layout.num_stages:
            return f"{spec.n_layers} layers < {layout.num_stages} pipeline stages"
    if layout.sharding == "zero1" and layout.dp > 1 and training.accounting == "engine":
        return ("meshlm's engine has no ZeRO-1 (optimizer state sharded, gradients and parameters replicated): "
                "use sharding zero2 or zero3, or --accounting zero for the ZeRO paper's bytes")
    if training.global_batch % layout.dp:
        return f"global batch of {training.global_batch} sequences is not divisible by dp {layout.dp}"
    local = training.global_batch // layout.dp
    if layout.pp > 1 and (layout.microbatches < 1 or local % layout.microbatches):
        return f"{local} sequences per data-parallel rank do not split into {layout.microbatches} micro-batches"
    if layout.pp > 1 and layout.micro_batch_size and layout.microbatches * layout.micro_batch_size != local:
        return (f"under pipelining a micro-batch is the {local} sequences per data-parallel rank / "
                f"{layout.microbatches} micro-batches, not micro_batch_size {layout.micro_batch_size}")
    if layout.pp == 1 and layout.micro_batch_size and local % layout.micro_batch_size:
        return f"{local} sequences per rank are not a multiple of micro-batch size {layout.micro_batch_size}"
    return ""


def evaluate(spec: ModelSpec, layout: Layout, training: Training, hw: Hardware, headroom: float = DEFAULT_HEADROOM,
             exact: bool = False, gpus: int | None = None, timed: bool = True) -> Evaluation:
    """One layout; ``exact`` checks every pipeline rank (the search checks the first and the last only);
    ``timed=False`` skips the step time of a layout that does not fit."""
    reason = validity(spec, layout, training)
    if gpus is not None and layout.world != gpus:
        reason = (f"dp_replicate x dp_shard x tp x pp = {layout.dp_replicate} x {layout.dp_shard} x {layout.tp} x "
                  f"{layout.pp} = {layout.world}, not the {gpus} GPUs")
    if reason:
        return Evaluation(layout, Memory(), None, False, reason, layout.world)
    if exact or layout.pp <= 2:
        mem = memory(spec, layout, training)
    else:
        mem = max((memory(spec, layout, training, r) for r in (0, layout.pp - 1)), key=lambda m: m.total)
    ev = Evaluation(layout, mem, gpus=layout.world)
    limit = hw.memory_gib * GIB * headroom
    if mem.total > limit:
        digits = 2 if mem.total < 1.01 * limit else 1
        ev.reason = (f"{mem.total / GIB:,.{digits}f} GiB per GPU > {limit / GIB:,.{digits}f} GiB usable "
                     f"({hw.memory_gib:g} GiB x {headroom:g} headroom)")
    ev.feasible = not ev.reason
    if ev.feasible or timed:
        ev.time = step_time(spec, layout, training, hw)
        ev.time.detail["tokens"] = float(training.tokens)
    return ev


# ------------------------------------------------------------------------------------------- enumeration
def _tp_options(spec: ModelSpec, hw: Hardware, gpus: int, training: Training) -> list[int]:
    out = []
    for t in divisors(gpus):
        if t > hw.gpus_per_node and t > 1:
            continue  # tensor parallelism stays inside a node
        if t == 1 or not (spec.n_heads % t or spec.n_kv_heads % t or spec.ffn_hidden_dim % t):
            out.append(t)
    return out


def _dp_splits(dp: int, tp: int, hw: Hardware, zero1: bool) -> Iterator[tuple[int, int, str]]:
    """(dp_replicate, dp_shard, sharding): replication, full FSDP (ZeRO-3 / ZeRO-2), ZeRO-1 when ``zero1`` (the
    paper's accounting, or pinned with --fix) and HSDP with shard groups of one node or a few nodes."""
    yield dp, 1, "none"
    if dp == 1:
        return
    yield 1, dp, "zero3"
    yield 1, dp, "zero2"
    if zero1:
        yield 1, dp, "zero1"
    shard = max(1, hw.gpus_per_node // tp)
    seen = set()
    while shard < dp and len(seen) < 4:
        if dp % shard == 0 and shard > 1:
            seen.add(shard)
            yield dp // shard, shard, "zero3"
        shard *= 2


def _micro_options(local: int, pp: int) -> list[int]:
    """Pipeline micro-batch counts (multiples of pp dividing the local batch), or accumulation micro-batch
    sizes (the local batch halved while it divides, largest first, down to 1: a single sequence per micro-step
    is how a large model fits on few devices, so the search must not stop short of it)."""
    if pp > 1:
        opts = [m for m in (pp * 2**k for k in range(5)) if m <= local and local % m == 0]
        if local not in opts and local % pp == 0 and local > pp:
            opts.append(local)  # one micro-batch per sequence: the smallest bubble
        if local % pp and local >= 1:
            opts.append(local)
        return opts or [local]
    sizes, b = [], local
    while b >= 1:
        if local % b == 0:
            sizes.append(b)
        b //= 2
    return sizes


def layouts(spec: ModelSpec, hw: Hardware, training: Training, gpus: int,
            fix: dict[str, Any]) -> Iterator[list[list[Layout]]]:
    """Groups of layouts that differ only by micro-batching and activation checkpointing (the search keeps
    the fastest that fits from each group), as lists per micro-batching option."""
    for tp in _tp_options(spec, hw, gpus, training) if "tp" not in fix else [fix["tp"]]:
        pps = [p for p in divisors(gpus // tp) if p <= spec.n_layers] if "pp" not in fix else [fix["pp"]]
        for pp in pps:
            if gpus % (tp * pp):  # only a pinned layout gets here: report it, with the reason
                yield [[_pinned(fix, max(gpus // (tp * pp), 1))]]
                continue
            dp = gpus // (tp * pp)
            zero1 = training.accounting == "zero" or fix.get("sharding") == "zero1"
            for rep, shard, sharding in _dp_splits(dp, tp, hw, zero1):
                if not _matches(fix, dp_replicate=rep, dp_shard=shard, sharding=sharding):
                    continue
                if pp > 1 and sharding == "zero2" and fix.get("sharding") != "zero2":
                    continue  # under pipelining FSDP keeps parameters gathered anyway: ZeRO-2 = ZeRO-3
                schedules = ["1f1b"] if pp == 1 else list(SCHEDULES)
                for schedule in schedules:
                    if not _matches(fix, pp_schedule=schedule):
                        continue
                    v = 2 if schedule in ("interleaved-1f1b", "interleaved-zb", "zbv") else 1
                    if pp > 1 and spec.n_layers < pp * v:
                        continue
                    base = Layout(rep, shard, tp, pp, schedule, v if pp > 1 else 1, sharding=sharding,
                                  sequence_parallel=tp > 1 and training.seq_len % tp == 0,
                                  loss_parallel=tp > 1 and spec.vocab_size % tp == 0)
                    yield list(_variants(base, training, fix))


def _pinned(fix: dict[str, Any], dp: int) -> Layout:
    keys = {k: v for k, v in fix.items() if k in Layout.__dataclass_fields__}
    if "dp_replicate" not in keys and "dp_shard" not in keys:
        keys["dp_shard"] = dp
    return Layout(**keys)


def _variants(base: Layout, training: Training, fix: dict[str, Any]) -> Iterator[list[Layout]]:
    """Per micro-batching option (largest micro-batch first), the layouts from least to most recompute."""
    local = max(training.global_batch // base.dp, 1)
    acs = [fix["activation_checkpointing"]] if "activation_checkpointing" in fix else list(AC_MODES)
    for micro in _micro_options(local, base.pp):
        if base.pp > 1:  # a pinned micro-batch size fixes the micro-batch count: local / size
            size = fix.get("micro_batch_size", 0)
            layout = replace(base, microbatches=fix.get("microbatches", max(local // size, 1) if size else micro),
                             micro_batch_size=size)
        else:
            layout = replace(base, micro_batch_size=fix.get("micro_batch_size", micro))
        yield [replace(layout, activation_checkpointing=ac) for ac in acs]
        if "microbatches" in fix or "micro_batch_size" in fix:
            return


def _matches(fix: dict[str, Any], **values: Any) -> bool:
    return all(fix[k] == v for k, v in values.items() if k in fix)


# ------------------------------------------------------------------------------------------------ search
def search(spec: ModelSpec, hw: Hardware, training: Training, gpus: int, fix: dict[str, Any] | None = None,
           headroom: float = DEFAULT_HEADROOM, top: int = 5) -> SearchResult:
    """The fastest layout that fits, the next ``top`` (the best of each layout group), and per family of
    layouts that has none that fits, its closest attempt (smallest memory overflow, else a validity reason)."""
    if gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {gpus}")
    fix = dict(fix or {})
    fitting: list[Evaluation] = []
    closest: dict[str, Evaluation] = {}
    count = 0
    for group in layouts(spec, hw, training, gpus, fix):
        # the group's least-memory variant (smallest micro-batch, most recompute) first: if it does not fit,
        # nothing in the group does
        options = [opts for opts in group if opts]
        smallest = evaluate(spec, options[-1][-1], training, hw, headroom, gpus=gpus, timed=False)
        count += 1
        if not smallest.feasible:
            family = smallest.layout.family()
            if family not in closest or _closeness(smallest) < _closeness(closest[family]):
                closest[family] = smallest
            continue
        best = None
        for by_ac in options:  # one micro-batching, activation checkpointing from none to full
            for layout in by_ac:
                ev = smallest if layout == smallest.layout else evaluate(spec, layout, training, hw, headroom,
                                                                          gpus=gpus, timed=False)
                count += 1
                if ev.feasible:  # less recompute is faster: stop at the first that fits
                    if best is None or _rank(ev) < _rank(best):
                        best = ev
                    break
        if best is not None:
            fitting.append(best)
    fitting.sort(key=_rank)
    families = {e.layout.family() for e in fitting}
    rejected = {f: ev for f, ev in closest.items() if f not in families}
    recommended = fitting[0] if fitting else None
    if recommended is None and fix:  # --fix never refuses: the closest attempt, marked infeasible
        attempts = sorted(closest.values(), key=_closeness)
        recommended = attempts[0] if attempts else None
    return SearchResult(recommended, fitting[1:top + 1], rejected, count, fitting)


def _rank(ev: Evaluation) -> tuple[float, float, float]:
    """Faster first; on a tie (within ~0.5%), less communication — overlap is the least certain part of the
    time model, so the layout that leans on it less is the safer pick — then less memory."""
    tps = ev.tokens_per_s
    # buckets of 0.5% in log space: the same relative width at every magnitude (decimal buckets sized by the
    # number of digits ranked 94,864 tokens/s above 217,093)
    bucket = -round(math.log(tps) / math.log(1.005)) if tps > 0 else 0
    return bucket, round(ev.time.comm_s / ev.time.step_time_s, 2) if ev.time else 0.0, ev.memory.total


def _closeness(ev: Evaluation) -> float:
    """Order infeasible attempts: smallest memory overflow first, layouts the engine cannot run last."""
    return ev.memory.total if ev.memory.total > 0 else float("inf")
