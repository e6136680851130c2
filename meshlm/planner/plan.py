"""A plan: the search, the taught decision order checked against the numbers, scaling efficiency, and the
bottleneck of the recommendation — everything ``meshlm plan`` prints or writes as JSON."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from meshlm.errors import ConfigError
from meshlm.planner.hardware import Hardware
from meshlm.planner.layout import Layout, Training
from meshlm.planner.memory import GIB
from meshlm.planner.model_spec import ModelSpec
from meshlm.planner.search import DEFAULT_HEADROOM, Evaluation, SearchResult, evaluate, search

# The rule of thumb taught for LLM training (e.g. the HF Ultra-Scale Playbook, torchtitan's docs): use data
# parallelism while the model fits; else shard it (ZeRO/FSDP); else add tensor parallelism inside a node;
# then pipeline parallelism across nodes.
TAUGHT_ORDER = [
    ("data parallelism", lambda lay: lay.tp == 1 and lay.pp == 1 and lay.dp_shard == 1),
    ("ZeRO/FSDP sharding", lambda lay: lay.tp == 1 and lay.pp == 1 and lay.dp_shard > 1),
    ("tensor parallelism inside a node", lambda lay: lay.tp > 1 and lay.pp == 1),
    ("pipeline parallelism across nodes", lambda lay: lay.pp > 1),
]


@dataclass
class Plan:
    spec: ModelSpec
    hw: Hardware
    training: Training
    gpus: int
    result: SearchResult
    fixed: bool = False
    taught: list[dict[str, Any]] = field(default_factory=list)
    verdict: str = ""
    scaling: dict[str, Any] = field(default_factory=dict)
    bottleneck: dict[str, str] = field(default_factory=dict)
    headroom: float = DEFAULT_HEADROOM

    @property
    def recommended(self) -> Evaluation:
        assert self.result.recommended is not None
        return self.result.recommended


def make_plan(spec: ModelSpec, hw: Hardware, training: Training, gpus: int, fix: dict[str, Any] | None = None,
              headroom: float = DEFAULT_HEADROOM, top: int = 5, scaling: bool = True) -> Plan:
    if not 0 < headroom <= 1:
        raise ConfigError(f"--headroom must be in (0, 1], got {headroom}")
    result = search(spec, hw, training, gpus, fix, headroom, top)
    if result.recommended is None:
        raise ConfigError(no_fit_message(spec, hw, training, gpus, result, headroom, fix))
    plan = Plan(spec, hw, training, gpus, result, fixed=bool(fix), headroom=headroom)
    if fix:  # check every pipeline rank of the layout the user asked for
        exact = evaluate(spec, result.recommended.layout, training, hw, headroom, exact=True)
        result.recommended = exact if exact.time is not None else result.recommended
    plan.taught, plan.verdict = decision_order(plan)
    plan.bottleneck = bottleneck(plan.recommended)
    if scaling and plan.recommended.feasible:
        plan.scaling = scaling_efficiency(plan, fix)
    return plan


def no_fit_message(spec: ModelSpec, hw: Hardware, training: Training, gpus: int, result: SearchResult,
                   headroom: float, fix: dict[str, Any] | None) -> str:
    usable = hw.memory_gib * headroom
    sized = [ev for ev in result.rejected.values() if ev.memory.total > 0]
    head = f"{spec.name} fits no layout of {gpus} x {hw.name}"
    if not sized:
        reasons = "; ".join(sorted({ev.reason for ev in result.rejected.values()}))[:300]
        return f"{head}: no valid layout ({reasons or 'nothing to try'}); change --gpus or --global-batch-*"
    best = min(sized, key=lambda ev: ev.memory.total)
    need = best.memory.total / GIB
    more = _gpus_needed(spec, hw, training, gpus, headroom)
    hint = f"use at least {more} GPUs" if more else "use more GPUs"
    return (f"{head}: the smallest layout ({best.layout.describe()}, {best.layout.activation_checkpointing} "
            f"activation checkpointing) needs {need:,.1f} GiB per GPU, {need / usable:.1f}x the {usable:,.1f} GiB "
            f"usable ({hw.memory_gib:g} GiB x {headroom:g} headroom); {hint}, GPUs with >= "
            f"{math.ceil(need / headroom):,} GiB, or a shorter --seq")


def _gpus_needed(spec: ModelSpec, hw: Hardware, training: Training, gpus: int, headroom: float) -> int | None:
    n = gpus * 2
    while n <= 1 << 17:
        if search(spec, hw, training, n, None, headroom, 1).recommended is not None:
            return n
        n *= 2
    return None


def decision_order(plan: Plan) -> tuple[list[dict[str, Any]], str]:
    """Walk the taught order; the first step that fits is the rule's pick. Then let the numbers speak."""
    fitting = plan.result.fitting
    steps, rule_pick = [], None
    for name, member in TAUGHT_ORDER:
        best = next((ev for ev in fitting if member(ev.layout)), None)
        if best is not None:
            steps.append({"step": name, "fits": True, "best": best.layout.describe(),
                          "tokens_per_s": best.tokens_per_s})
            rule_pick = rule_pick or best
        else:
            tried = [ev for f, ev in plan.result.rejected.items() if member(ev.layout)]
            near = min(tried, key=lambda ev: ev.memory.total or math.inf) if tried else None
            steps.append({"step": name, "fits": False,
                          "reason": f"{near.layout.family()}: {near.reason}" if near else "no layout of this kind"})
    best = plan.recommended
    if plan.fixed or rule_pick is None:
        return steps, ""
    if rule_pick is best:
        return steps, f"The rule of thumb and the numbers agree: {_step_of(best.layout)} is the first step that fits."
    gain = best.tokens_per_s / rule_pick.tokens_per_s - 1
    why = _why_faster(best, rule_pick)
    return steps, (f"The numbers overrule the rule of thumb: it stops at {_step_of(rule_pick.layout)} "
                   f"({rule_pick.layout.describe()}), but {best.layout.describe()} is {100 * gain:.0f}% faster: {why}.")


def _step_of(layout: Layout) -> str:
    return next(name for name, member in TAUGHT_ORDER if member(layout))


def _why_faster(fast: Evaluation, slow: Evaluation) -> str:
    parts = {"compute (incl. recompute)": "compute_s", "tensor-parallel communication": "tp_comm_s",
             "exposed data-parallel communication": "dp_exposed_s", "pipeline bubble": "bubble_s",
             "pipeline sends": "p2p_s"}
    diffs = sorted(((getattr(slow.time, a) - getattr(fast.time, a), name) for name, a in parts.items()),
                   reverse=True)
    saved = [f"{d:.3g} s less {name}" for d, name in diffs if d > 0][:2]
    text = " and ".join(saved) if saved else "a shorter step"
    if fast.layout.activation_checkpointing != slow.layout.activation_checkpointing:
        text += (f" (it fits with {fast.layout.activation_checkpointing} activation checkpointing instead of "
                 f"{slow.layout.activation_checkpointing})")
    return text


def bottleneck(ev: Evaluation) -> dict[str, str]:
    """The largest non-compute share of the step and the first thing to try about it."""
    t = ev.time
    if t is None:
        return {}
    costs = {"tensor-parallel communication": t.tp_comm_s, "exposed data-parallel communication": t.dp_exposed_s,
             "pipeline bubble": t.bubble_s, "pipeline sends": t.p2p_s}
    name, seconds = max(costs.items(), key=lambda kv: kv[1])
    share = seconds / t.step_time_s
    if share < 0.05:
        out = {"bottleneck": "compute", "share": f"{t.compute_s / t.step_time_s:.0%}",
               "mitigation": "compute-bound: raise efficiency (torch.compile, fused kernels, Float8) or add GPUs"}
        if t.dp_comm_s > 0.7 * t.compute_s:
            out["mitigation"] += (f"; note: data-parallel traffic ({t.dp_comm_s:.3g} s) is hidden behind compute "
                                  f"({t.compute_s:.3g} s) with little to spare — fewer tokens per GPU or slower "
                                  "links would expose it")
        return out
    fixes = {
        "tensor-parallel communication": "keep TP inside a node and smaller (trade it for FSDP or PP); overlap it "
                                         "(async TP)",
        "exposed data-parallel communication": "more tokens per GPU per step (a larger micro-batch or global "
                                               "batch) so compute hides the gathers, or HSDP (shard inside a "
                                               "node, replicate across) to keep the heavy traffic on NVLink",
        "pipeline bubble": "more micro-batches per step, or an interleaved / zero-bubble schedule",
        "pipeline sends": "fewer pipeline stages, or stages inside a node",
    }
    return {"bottleneck": name, "share": f"{share:.0%}", "mitigation": fixes[name]}


def scaling_efficiency(plan: Plan, fix: dict[str, Any] | None) -> dict[str, Any]:
    """Throughput per GPU of the recommendation relative to the smallest GPU count (a power-of-two fraction
    of --gpus) on which some layout fits, keeping the global batch."""
    spec, hw, training = plan.spec, plan.hw, plan.training
    usable = hw.memory_gib * GIB * plan.headroom
    states = 16.0 * spec.num_params()  # params + grads + Adam states, fully sharded
    n = plan.gpus
    while n > 1 and plan.gpus % (n // 2) == 0 and states / (n // 2) < usable:
        n //= 2
    base = None
    while n <= plan.gpus:
        base = search(spec, hw, training, n, None, plan.headroom, 1).recommended if n < plan.gpus else \
            plan.recommended
        if base is not None:
            break
        n *= 2
    if base is None:
        return {}
    ours = plan.recommended.tokens_per_s / plan.gpus
    ref = base.tokens_per_s / n
    out = {"smallest_gpus": n, "smallest_layout": base.layout.describe(),
           "tokens_per_s_per_gpu_smallest": ref, "scaling_efficiency": ours / ref if ref else 0.0}
    if ref and ours > ref * 1.01:
        out["note"] = (f"above 100%: on {n} GPUs the model only fits with {base.layout.activation_checkpointing} "
                       f"activation checkpointing / micro-batch {base.layout.micro_batch_size or '-'} (more "
                       "recompute or accumulation per token)")
    return out
