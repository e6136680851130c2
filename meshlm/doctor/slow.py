"""``meshlm diagnose slow RUN_DIR [--profile STEPS]``: where a run's step time goes, measured, beside the
planner's prediction, with what to change and why.

Measured figures come from what the run recorded (``metrics.jsonl``): the window step time and tokens/s, the
host time spent getting batches (``data_wait_s``), and on the steps the trainer profiles (every
``metrics.comm_sample_interval`` steps of a multi-rank run) the collective time from the profiler, the optimizer
step time (torch.optim's ``Optimizer.step#`` events) and, per rank, all of these (``per_rank``, gathered at each
log step). ``--profile STEPS`` resumes a copy of the run from its newest checkpoint (or starts its config afresh
when it has none) and profiles STEPS steps, every one of them, after one warm-up step.

Definitions: a rank's *busy* time is its profiled step time minus its time in collectives; a straggler is a
rank whose busy time exceeds the median rank's by more than 25% (synchronous ranks all wait for the slowest, so
wall step times are equal and show nothing). Under pipelining the bubble is spent waiting in the stage's
receives, which the profiler counts as collective time: ``pipeline_wait_share`` is that share on pipelined
ranks, an upper bound on the bubble, shown beside the planner's bubble.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from meshlm.config.loader import config_to_toml, load_config
from meshlm.errors import ConfigError
from meshlm.planner.predict import layout_from_config
from meshlm.planner.timing import bubble_fraction
from meshlm.train.run_dir import init_run_dir

STRAGGLER = 1.25  # busy time above the median rank's by this factor
PROFILE_OVERRIDES = ["metrics.interval=1", "metrics.comm_sample_interval=1", "checkpoint.enabled=false",
                     "training.eval_interval=0", "metrics.tensorboard=false", "metrics.progress=plain"]


def read_run(run_dir: Path) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """(config, metrics records, plan_prediction.json or {}) of a run directory."""
    run_dir = Path(run_dir)
    config, metrics = run_dir / "config.resolved.toml", run_dir / "metrics.jsonl"
    if not config.is_file() or not metrics.is_file():
        raise ConfigError(f"'{run_dir}' is not a meshlm run directory (needs config.resolved.toml and "
                          "metrics.jsonl); pass the --run-dir of a `meshlm train` run")
    records = []
    for line in metrics.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a crash
    if not records:
        raise ConfigError(f"{metrics} has no records yet; let the run log at least one step")
    plan = run_dir / "plan_prediction.json"
    prediction = json.loads(plan.read_text()) if plan.is_file() else {}
    return load_config(config), records, prediction


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def measured(records: list[dict[str, Any]], profiled: bool = False) -> dict[str, Any]:
    """Step-time shares from the records (the first window, which holds start-up, is left out when others
    exist, except for a profiled copy whose records are all profiled steps: their step time is the profiled
    step's own, without the trace export)."""
    steady = records[1:] if len(records) > 1 and not profiled else records
    step = _median([r["measured_step_s" if profiled else "step_time_s"] for r in steady])
    out: dict[str, Any] = {"step_time_s": step, "tokens_per_s": _median([r["tokens_per_s"] for r in steady]),
                           "data_wait_share": _median([r["data_wait_s"] / r["step_time_s"] for r in steady
                                                       if "data_wait_s" in r and r["step_time_s"] > 0]),
                           "comm_share": None, "optimizer_share": None, "profiled_steps": []}
    sampled = {r["comm_measured_step"]: r for r in records if "comm_measured_step" in r and "measured_step_s" in r}
    if sampled:
        rows = list(sampled.values())
        out["profiled_steps"] = sorted(sampled)
        out["comm_share"] = _median([r["comm_s"] / r["measured_step_s"] for r in rows])
        out["optimizer_share"] = _median([r["optimizer_s"] / r["measured_step_s"] for r in rows])
    return out


def per_rank(records: list[dict[str, Any]], profiled: bool = False) -> list[dict[str, Any]]:
    """Median per-rank figures over the records that carry them (all of a profiled copy's, else all but the
    first window)."""
    rows = [r["per_rank"] for r in (records[1:] if len(records) > 1 and not profiled else records)
            if "per_rank" in r]
    if not rows:
        return []
    ranks = len(rows[-1]["step_time_s"])
    out = []
    for k in range(ranks):
        def med(key: str, only_profiled: bool = False) -> float | None:
            vals = [row[key][k] for row in rows if len(row[key]) == ranks
                    and (not only_profiled or row["measured_step_s"][k] > 0)]
            return _median(vals)
        entry = {"rank": k, "step_time_s": med("step_time_s"), "data_wait_s": med("data_wait_s"),
                 "profiled_step_s": med("measured_step_s", True), "comm_s": med("comm_s", True),
                 "optimizer_s": med("optimizer_s", True)}
        entry["busy_s"] = (entry["profiled_step_s"] - entry["comm_s"]) if entry["profiled_step_s"] else None
        out.append(entry)
    return out


def stragglers(ranks: list[dict[str, Any]], pp: int = 1) -> list[int]:
    """Ranks whose busy time exceeds their pipeline stage's median rank's (stages do different work: the
    first holds the embedding, the last the head and the loss; they are compared by :func:`stage_balance`)."""
    out = []
    for group in _stage_groups(ranks, pp).values():
        busy = [r["busy_s"] for r in group if r["busy_s"] is not None]
        if len(busy) < 2:
            continue
        median = statistics.median(busy)
        out += [r["rank"] for r in group if r["busy_s"] is not None and r["busy_s"] > STRAGGLER * median]
    return sorted(out)


def _stage_groups(ranks: list[dict[str, Any]], pp: int) -> dict[int, list[dict[str, Any]]]:
    """Ranks by pipeline stage: the mesh is (pp, dp_replicate, dp_shard, tp), pp outermost."""
    per_stage = max(len(ranks) // max(pp, 1), 1)
    groups: dict[int, list[dict[str, Any]]] = {}
    for r in ranks:
        groups.setdefault(r["rank"] // per_stage, []).append(r)
    return groups


def stage_balance(ranks: list[dict[str, Any]], pp: int) -> list[float | None]:
    """Median busy seconds of each pipeline stage's ranks."""
    return [_median([r["busy_s"] for r in group]) for _, group in sorted(_stage_groups(ranks, pp).items())]


def predicted(cfg, world: int, prediction: dict[str, Any]) -> dict[str, Any]:
    """The run's own planner prediction (plan_prediction.json) and the layout's pipeline bubble."""
    _, layout, _ = layout_from_config(cfg, world)
    pred = prediction.get("predicted", {})
    return {"layout": layout.describe(), "step_time_s": pred.get("step_time_s"),
            "tokens_per_s": pred.get("tokens_per_s"), "comm_share": pred.get("comm_share"),
            "bubble": bubble_fraction(layout), "hardware": prediction.get("hardware")}, layout


def recommend(cfg, layout, meas: dict[str, Any], pred: dict[str, Any], slow_ranks: list[int],
              ranks: list[dict[str, Any]]) -> list[dict[str, str]]:
    """What to change, each with the measured reason. Thresholds: a share worth acting on is 10% of the step."""
    out: list[dict[str, str]] = []
    comm, data, opt = meas["comm_share"], meas["data_wait_share"], meas["optimizer_share"]
    tc = cfg.training
    if comm is not None and comm > 0.3 and layout.dp > 1:
        if layout.uses_ddp:
            out.append({"change": "more tokens per all-reduce: a larger training.batch_size with accumulation "
                                  "(training.micro_batch_size), or FSDP/HSDP",
                        "why": f"collectives take {comm:.0%} of a profiled step; DDP all-reduces once per optimizer "
                               "step, so accumulation amortises it (its bucket size, torch's 25 MB default, is not "
                               "a meshlm key)"})
        else:
            out.append({"change": "a larger micro-batch per rank (training.micro_batch_size, or fewer ranks with "
                                  "the same batch), parallel.reshard_after_forward=never (no backward all-gather), "
                                  "or HSDP (parallel.dp_replicate) to keep gathers inside a node",
                        "why": f"collectives take {comm:.0%} of a profiled step; FSDP gathers and reduce-scatters "
                               "every block on every micro-step (its buckets are the blocks), so accumulation does "
                               "not amortise it but more tokens per micro-step do"})
    if comm is not None and comm > 0.3 and layout.tp > 1:
        out.append({"change": f"lower parallel.tp (now {layout.tp}) or keep it inside one node",
                    "why": f"collectives take {comm:.0%} of a profiled step; tensor parallelism communicates "
                           "in every layer, on the critical path"})
    stages = stage_balance(ranks, layout.pp) if layout.pp > 1 else []
    if len(stages) > 1 and all(stages) and max(stages) > STRAGGLER * min(stages):
        slowest = stages.index(max(stages))
        out.append({"change": "balance the pipeline stages (the engine splits layers evenly; the first stage "
                              "also runs the embedding, the last the head and the loss): fewer stages, or more "
                              "layers per stage so the ends weigh less",
                    "why": f"stage {slowest} is busy {max(stages) * 1e3:.1f} ms per step against "
                           f"{min(stages) * 1e3:.1f} ms for the lightest; the others wait for it"})
    if layout.pp > 1 and pred["bubble"] > 0.1:
        out.append({"change": f"more pipeline micro-batches (parallel.microbatches, now {layout.microbatches}) or "
                              "parallel.pp_schedule=interleaved-1f1b",
                    "why": f"the {layout.pp_schedule} bubble is (p-1)/m = {pred['bubble']:.0%} of the busy time"})
    if data is not None and data > 0.1:
        out.append({"change": "feed the loader from local disk (prepared memmap shards, `meshlm prepare`) and "
                              "larger batches per read",
                    "why": f"getting batches takes {data:.0%} of the step on the training thread (the loader reads "
                           "synchronously)"})
    if opt is not None and opt > 0.1:
        out.append({"change": "more accumulation per optimizer step (a larger training.batch_size at the same "
                              "micro-batch)",
                    "why": f"the optimizer step takes {opt:.0%} of a profiled step; it runs once per step whatever "
                           "the batch"})
    for rank in slow_ranks:
        busy = next(r["busy_s"] for r in ranks if r["rank"] == rank)
        out.append({"change": f"look at rank {rank}'s device or host (other processes, clocks, a slower link)",
                    "why": f"its busy time ({busy * 1e3:.1f} ms) exceeds the median rank's by more than "
                           f"{STRAGGLER - 1:.0%}; every other rank waits for it in each collective"})
    if pred["step_time_s"] and meas["step_time_s"] and meas["step_time_s"] > 3 * pred["step_time_s"]:
        out.append({"change": "calibrate the planner on this machine (`meshlm plan --calibrate`) before trusting "
                              "its layout choice",
                    "why": f"the step takes {meas['step_time_s'] / pred['step_time_s']:.1f}x the predicted "
                           f"{pred['step_time_s']:.3g} s: fixed per-kernel overheads dominate small models, and the "
                           "planner models FLOPs and bytes only"})
    if tc.activation_checkpointing == "full":
        out.append({"change": "training.activation_checkpointing=selective (or none) if memory allows "
                              "(`meshlm diagnose oom` tells)",
                    "why": "full recomputation repeats every block's forward: about a third more compute"})
    return out


def profile(run_dir: Path, work: Path, steps: int, world: int) -> tuple[Path, int]:
    """Resume a copy of the run (its newest checkpoint) and profile ``steps`` steps after one warm-up."""
    from meshlm.distributed.launch import launch_local
    from meshlm.doctor.callbacks import run_callbacks
    from meshlm.train.trainer import Trainer

    copy = work / "profiled"
    saved = sorted(p for p in (Path(run_dir) / "checkpoints").glob("step-*") if p.name[5:].isdigit())
    start = int(saved[-1].name[5:]) if saved else 0
    config = Path(run_dir) / "config.resolved.toml"
    traces = work / "traces"
    overrides = [*PROFILE_OVERRIDES, f"training.steps={start + steps + 1}",
                 f"diagnostics.trace_dir={json.dumps(str(traces))}"]  # a TOML string: every rank keeps its traces
    cfg = load_config(config, overrides)
    init_run_dir(copy, config_to_toml(cfg), resume=False)
    if saved:
        shutil.copytree(saved[-1], copy / "checkpoints" / saved[-1].name)
    traces.mkdir(parents=True, exist_ok=True)
    if world > 1:
        worker = ["train", str(config), *[a for o in overrides for a in ("--set", o)], "--run-dir", str(copy),
                  "--resume", "auto"]
        launch_local(world, 0, worker, cfg.parallel.timeout_s)
    else:
        Trainer(cfg, copy, resume=True, callbacks=run_callbacks(cfg)).train()
    return copy, start


def diagnose(run_dir: str, profile_steps: int | None, work_dir: Path) -> dict[str, Any]:
    run = Path(run_dir)
    cfg, records, prediction = read_run(run)
    world = len(records[-1].get("per_rank", {}).get("step_time_s", [])) or _world_from(prediction, cfg)
    source, profiled_dir, profiled = "metrics.jsonl", None, profile_steps is not None
    if profiled:
        if profile_steps < 1:
            raise ConfigError(f"--profile must be at least 1 step, got {profile_steps}")
        profiled_dir, start = profile(run, work_dir, profile_steps, world)
        _, all_records, _ = read_run(profiled_dir)
        records = [r for r in all_records if "measured_step_s" in r and r.get("comm_measured_step") == r["step"]]
        if not records:
            raise ConfigError(f"the profiled copy in {profiled_dir} logged no profiled step")
        origin = f"resumed at step {start}" if start else "started afresh: the run has no checkpoint"
        source = f"a profiled copy ({len(records)} steps, {origin})"
    meas = measured(records, profiled)
    ranks = per_rank(records, profiled)
    pred, layout = predicted(cfg, world, prediction)
    slow = stragglers(ranks, layout.pp)
    if layout.pp > 1 and ranks and ranks[0]["comm_s"] is not None:
        meas["pipeline_wait_share"] = _median([r["comm_s"] / r["profiled_step_s"] for r in ranks
                                               if r["profiled_step_s"]])
    else:
        meas["pipeline_wait_share"] = None
    return {"run_dir": str(run), "source": source, "nproc": world, "layout": layout.describe(),
            "measured": meas, "predicted": pred, "ranks": ranks, "stragglers": slow,
            "stage_busy_s": stage_balance(ranks, layout.pp) if layout.pp > 1 else None,
            "recommendations": recommend(cfg, layout, meas, pred, slow, ranks),
            "profiled_run": str(profiled_dir) if profiled_dir else None,
            "traces": sorted(str(p) for p in (work_dir / "traces").glob("*.json")) if profiled_dir else []}


def _world_from(prediction: dict[str, Any], cfg) -> int:
    """World size of a run whose records predate ``per_rank``: the product of its explicit degrees."""
    pc = cfg.parallel
    return max(pc.dp_replicate * max(pc.dp_shard, 1) * pc.tp * pc.pp, 1)
