"""``meshlm demo``: the whole workflow on the embedded default, offline, in a few minutes on two CPU cores.

pretrain -> SFT -> DPO on the spec's data -> the safety table before and after -> registry -> ``meshlm serve`` ->
one request through the official ``openai`` client -> ``meshlm audit verify`` -> plots and the next commands to try
on a real model. The stages are :mod:`meshlm.demo`'s; everything goes into a new folder (``--run-dir``, default
``runs/demo-<time>``): ``align/`` (the align run), ``registry.sqlite``, ``audit.sqlite``, ``serve.log``,
``plots/losses.png`` and ``demo.json`` (stage times, the answer, the audit check).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

STAGES = 6


def register(sub, add_config_args) -> None:
    p = sub.add_parser("demo", help="the whole workflow on the embedded default: pretrain, SFT, DPO, safety table, "
                                    "registry, serve, one OpenAI-client request, audit verify, plots",
                       description="Runs `meshlm align` (embedded config, sized down), registers the final model, "
                                   "serves it on 127.0.0.1, sends one chat request with the openai client, verifies "
                                   "the audit log and plots, offline, in a few minutes on two CPU cores. A smoke "
                                   "run of the workflow on a tiny model, not a result.")
    p.add_argument("--run-dir", help="a new or empty folder for everything the demo writes (default "
                                     "runs/demo-<time>)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a key of the demo's align config (configs/align.toml with the demo's sizes; "
                        "e.g. --set sft.steps=800 for the default's)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from meshlm.demo import stages as st
    from meshlm.safety.align_config import load_align_config

    cfg = load_align_config(None, [*st.DEMO_ALIGN, *args.overrides])  # a bad --set fails here (exit 2)
    run_dir = st.fresh_run_dir(args.run_dir)
    started = time.perf_counter()
    _intro(run_dir, args.overrides)
    clock = st.Clock(STAGES)
    result: dict = {"run_dir": str(run_dir), "align_overrides": [*st.DEMO_ALIGN, *args.overrides]}
    try:
        code = _stages(cfg, run_dir, clock, result)
    except st.StageFailed as exc:
        print(f"\nmeshlm demo: {exc}", flush=True)
        code = 1
    result.update(stage_s=clock.times, total_s=time.perf_counter() - started, load_average=os.getloadavg(),
                  cpu_count=os.cpu_count(), exit_code=code)
    _write_json(run_dir / "demo.json", result)
    print(f"\ndemo {'done' if code == 0 else 'FAILED'} in {result['total_s']:.0f} s on {os.cpu_count()} CPUs (load "
          f"average {os.getloadavg()[0]:.1f}); everything is in {run_dir} (demo.json: times and results)")
    if code == 0:
        _next_commands()
    return code


def _intro(run_dir: Path, overrides: list[str]) -> None:
    from meshlm.demo.stages import DEMO_ALIGN, openai_missing
    from meshlm.safety.align_config import load_align_config

    default = load_align_config(None)
    values = dict(item.split("=", 1) for item in [*DEMO_ALIGN, *overrides])  # a later --set wins
    sized = []
    for key, value in values.items():
        section, name = key.split(".", 1)
        sized.append(f"{key}={value} (default {json.dumps(getattr(getattr(default, section), name, None))})")
    print("meshlm demo: the whole workflow on the embedded default, offline: the behaviour spec's data -> pretrain "
          "-> SFT -> DPO -> safety table before/after -> registry -> serve -> one request -> audit verify -> plots.")
    print("A smoke run of the workflow, not a result: the model is tiny and trains for minutes, so its safety "
          "figures are poor and its gates are expected to fail. The commands printed at the end run the same "
          "workflow on a real model.")
    print(f"run directory: {run_dir}")
    print("align config: the embedded configs/align.toml sized down: " + ", ".join(sized))
    if openai_missing():
        print("note: the `openai` client is not installed, so the request stage will send nothing: `pip install "
              "openai` (meshlm's test extra has it; `make demo` installs it)")


def _stages(cfg, run_dir: Path, clock, result: dict) -> int:
    """Every stage in order, each with a short summary; returns the exit code (0: every stage did its job)."""
    from meshlm.demo import stages as st
    from meshlm.demo import summary

    align_dir = run_dir / "align"
    with clock.stage("align", "align: spec -> data -> pretrain -> SFT -> DPO -> red team -> evaluation "
                              f"(as `meshlm align --run-dir {align_dir} --set ...`)"):
        from meshlm.safety.pipeline import run_pipeline

        report = run_pipeline(cfg, align_dir, log=_say)
        _say(f"model: {summary.model_line(align_dir)}")
        for line in summary.stage_lines(report, align_dir):
            _say(line)
    result["align"] = {"report": str(align_dir / "report.md"), "timings_s": report["timings"],
                       "passed": report["passed"]}
    with clock.stage("safety", "safety before/after alignment: held-out prompts, model alone, judge "
                               f"`{cfg.eval.judge}`, Wilson 95% intervals"):
        for line in summary.safety_table(report):
            _say(line)
        _say(f"full report: {align_dir / 'report.md'}")
    registry, audit = run_dir / "registry.sqlite", run_dir / "audit.sqlite"
    with clock.stage("registry", "registry: the final model as a numbered version with its hashes and gates"):
        entry = st.register(align_dir, report, registry, _say)
    result["registry"] = {"ref": entry.ref, "gate_status": entry.gate_status, "weights_sha256": entry.weights_sha256}
    with clock.stage("serve", "serve: `meshlm serve` on 127.0.0.1 (a free port), one chat request through the "
                              "official openai client, then SIGTERM"):
        served = st.serve_and_ask(registry, entry, audit, run_dir, _say)
        _print_request(served)
    result["serve"] = served
    with clock.stage("audit", "audit: `meshlm audit verify` recomputes the log's hash chain"):
        audit_code = st.cli(["audit", "verify", str(audit)], _say)
    result["audit"] = {"db": str(audit), "exit_code": audit_code}
    with clock.stage("plots", "plots"):
        result["plots"] = _plots(report, align_dir, run_dir)
    ok = served["exit_code"] == 0 and audit_code == 0
    return 0 if ok else 1


def _say(line: str) -> None:
    """A stage's line, indented under its [k/N] title."""
    print(f"    {line}", flush=True)


def _print_request(served: dict) -> None:
    request = served.get("request")
    if request:
        answer = (request["answer"] or "").replace("\n", " ⏎ ")
        _say(f"user: {request['question']}")
        _say(f"{request['version']}: {answer}")
        _say(f"({request['prompt_tokens']} prompt + {request['completion_tokens']} completion tokens, finish "
             f"{request['finish_reason']}, {request['latency_s']:.2f} s)")
    _say(f"server stopped, exit code {served['exit_code']}")


def _plots(report: dict, align_dir: Path, run_dir: Path) -> dict[str, str]:
    from meshlm.demo.summary import STAGE_LABELS, stage_dir
    from meshlm.plots import plot_stage_losses

    stages = [(STAGE_LABELS[s], d) for s in STAGE_LABELS if (d := stage_dir(align_dir, s)) is not None]
    plots = {"losses": str(plot_stage_losses(stages, run_dir / "plots" / "losses.png")), "safety": report["plot"]}
    _say(f"loss curve of each training stage        {plots['losses']}")
    _say(f"safety rates before and after (bars)      {plots['safety']}")
    return plots


def _next_commands() -> None:
    from meshlm.cli.fetch import model_path
    from meshlm.demo.summary import next_commands

    print("\nnext, the same workflow on a real model (SmolLM2-135M-Instruct; docs/real-models.md, docs/safety.md):")
    for line in next_commands(model_path("smollm2")):
        print(f"  {line}")


def _write_json(path: Path, doc: dict) -> None:
    from meshlm.fileio import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(doc, indent=1, default=str) + "\n")
