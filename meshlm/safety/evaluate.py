"""Judged safety evaluation: prompts -> responses (a checkpoint or an endpoint) -> labels -> rates -> gates.

Three swappable pieces joined by plain rows (as inspect-ai / garak do): a ``generate(prompts) -> responses``
callable, a judge (judge.py) and optionally a guard (guard.py). The report keeps the sample-level records.

    rows = read_prompt_rows("eval_prompts.jsonl")
    report = evaluate_safety(rows, checkpoint_generator("runs/dpo"), RuleJudge(), gates="refusal_rate>=0.95")
    write_outputs(report, "out/")          # responses.jsonl, report.json, report.md

The report's top level is the model alone (the figures targets apply to); ``with_guard`` is model + guard.
``generation`` says what generating cost: seconds, prompts, new tokens and tokens/s (new tokens null where the
generator cannot count them: an endpoint whose answers carry no ``usage``).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from meshlm.data.jsonl import iter_jsonl
from meshlm.errors import DataError
from meshlm.safety.endpoint import Endpoint
from meshlm.safety.metrics import DEGENERACY, HEADLINE, evaluate_gates, parse_gates, summarize
from meshlm.safety.taxonomy import POLICIES

Generate = Callable[[list[str]], list[str]]
GUARD_REFUSAL = "I can't help with that request."  # what the system returns when the guard blocks a turn


def read_prompt_rows(path: str | Path) -> list[dict[str, Any]]:
    """Evaluation rows ``{"prompt", "expected", "category"?, "family"?, ...}`` from a JSONL file."""
    rows = [check_prompt_row(row, where)
            for where, row in iter_jsonl(path, "a JSONL file of {prompt, expected} rows (the prompts file)")]
    if not rows:
        raise DataError(f"prompts file {path} has no rows")
    return rows


def check_prompt_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object with prompt and expected")
    if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
        raise DataError(f"{where}: 'prompt' must be a non-empty string")
    if row.get("expected") not in POLICIES:
        raise DataError(f"{where}: 'expected' must be one of {', '.join(POLICIES)} (got {row.get('expected')!r})")
    for key in ("category", "family"):
        if row.get(key) is not None and not isinstance(row[key], str):
            raise DataError(f"{where}: {key!r} must be a string when given")
    return row


def evaluate_safety(rows: Sequence[Mapping[str, Any]], generate: Generate, judge=None, guard=None,
                    gates: str | Iterable[str] | None = None, *, batch_size: int = 32,
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Generate, judge and summarise; returns the report dict (``records`` holds one row per prompt).

    ``rows``: ``{"prompt", "expected", "category"?, "family"?}``. ``generate`` gets a list of prompts and
    returns one response each (batches of ``batch_size``). ``judge``: a :class:`~meshlm.safety.judges.Judge`
    (the default judge when None). ``guard``: a :class:`~meshlm.safety.guard.Guard`; with one the report also
    has ``with_guard``. ``gates``: an expression such as ``refusal_rate>=0.95,false_refusal_rate<=0.05``,
    parsed before anything is generated so a typo fails at once.
    """
    from meshlm.safety.generation import Measured
    from meshlm.safety.judges import make_judge

    judge = judge or make_judge(None)
    generate = Measured(generate)
    parsed = parse_gates(gates)
    rows = [check_prompt_row(dict(r), f"row {i}") for i, r in enumerate(rows)]
    prompts = [r["prompt"] for r in rows]
    responses: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        out = generate(batch)
        if len(out) != len(batch):
            raise RuntimeError(f"generate returned {len(out)} responses for {len(batch)} prompts")
        responses += [str(x) for x in out]
        if progress:
            progress(f"generated {len(responses)}/{len(prompts)}")
    labels = judge.label(prompts, responses)
    records = [{"prompt": r["prompt"], "response": resp, "label": lab, "expected": r["expected"],
                "category": r.get("category"), "family": r.get("family") or "direct"}
               for r, resp, lab in zip(rows, responses, labels)]
    report: dict[str, Any] = {"judge": judge.name, **summarize(records), "generation": generate.stats()}
    if guard is not None:
        apply_guard(guard, records)
        report["guard"] = guard.name
        report["with_guard"] = summarize([{**r, "label": r["guarded_label"]} for r in records])
    report["gates"] = evaluate_gates(parsed, report)
    report["passed"] = all(g["passed"] for g in report["gates"])
    report["records"] = records
    return report


def apply_guard(guard, records: list[dict[str, Any]]) -> None:
    """Model + guard: a prompt the guard classes ``refuse`` is blocked before the model answers; otherwise a
    response the guard classes ``refuse`` (content that must be refused) is blocked. A blocked turn returns
    :data:`GUARD_REFUSAL`, labelled refuse. Records gain ``guard_prompt``, ``guard_response``,
    ``guarded_label``; the model's own ``label`` is kept."""
    prompts = [r["prompt"] for r in records]
    on_prompt = guard.classify_prompts(prompts)
    on_response = guard.classify_responses(prompts, [r["response"] for r in records])
    for record, p_cls, r_cls in zip(records, on_prompt, on_response):
        record["guard_prompt"], record["guard_response"] = p_cls, r_cls
        blocked = p_cls == "refuse" or r_cls == "refuse"
        record["guarded_label"] = "refuse" if blocked else record["label"]


def write_outputs(report: Mapping[str, Any], out_dir: str | Path,
                  markdown: Callable[[Mapping[str, Any]], str] | None = None) -> dict[str, Path]:
    """DIR/responses.jsonl (the records), DIR/report.json (the report without records), DIR/report.md (by
    ``markdown``, the safety report's by default)."""
    from meshlm.fileio import atomic_write_text

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    body = {k: v for k, v in report.items() if k != "records"}
    paths = {"responses": out / "responses.jsonl", "report": out / "report.json", "markdown": out / "report.md"}
    atomic_write_text(paths["responses"], "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                  for r in report.get("records", [])))
    atomic_write_text(paths["report"], json.dumps(body, indent=2) + "\n")
    atomic_write_text(paths["markdown"], (markdown or report_markdown)(body))
    return paths


def _fmt(stat: Mapping[str, Any] | None) -> str:
    if not stat or not stat.get("n"):
        return "–"
    lo, hi = stat["ci95"]
    return f"{stat['rate']:.3f} [{lo:.3f}, {hi:.3f}] (n={stat['n']})"


def report_markdown(report: Mapping[str, Any]) -> str:
    """A human-readable report: the model alone and model + guard side by side, groups, gates."""
    systems = [("model alone", report)] + ([("model + guard", report["with_guard"])] if "with_guard" in report
                                           else [])
    lines = ["# Safety evaluation\n", f"judge: `{report.get('judge')}`" +
             (f", guard: `{report['guard']}`" if report.get("guard") else "") + f", prompts: {report['n']}\n",
             "Rates with Wilson 95% intervals.\n", "| metric | " + " | ".join(n for n, _ in systems) + " |",
             "|---|" + "---|" * len(systems)]
    for metric in HEADLINE + ("over_warn_rate", "under_refusal_rate") + DEGENERACY:
        lines.append(f"| {metric} | " + " | ".join(_fmt(s.get(metric)) for _, s in systems) + " |")
    for group in ("by_category", "by_family"):
        for title, block in systems:
            lines += [f"\n## {group} — {title}\n", "| name | " + " | ".join(HEADLINE) + " |",
                      "|---|" + "---|" * len(HEADLINE)]
            for name, stats in block[group].items():
                lines.append(f"| {name} | " + " | ".join(_fmt(stats.get(m)) for m in HEADLINE) + " |")
    lines += generation_markdown(report.get("generation"))
    if report.get("gates"):
        lines += ["\n## Gates\n", "| gate | value | n | result |", "|---|---|---|---|"]
        for g in report["gates"]:
            value = "–" if g["value"] is None else f"{g['value']:.4f}"
            verdict = "pass" if g["passed"] else "FAIL" + (f" ({g['reason']})" if g.get("reason") else "")
            lines.append(f"| `{g['gate']}` | {value} | {g['n']} | {verdict} |")
    return "\n".join(lines) + "\n"


def generation_markdown(block: Mapping[str, Any] | None) -> list[str]:
    """One line for a report: what generating took."""
    if not block:
        return []
    tokens = "new tokens not counted" if block["new_tokens"] is None else \
        f"{block['new_tokens']} new tokens, {block['tokens_per_s']} tokens/s"
    return [f"\ngeneration: {block['prompts']} prompts in {block['seconds']:.1f} s, {tokens}"]


# ---- generators ---------------------------------------------------------------------------------------------
def endpoint_generator(base_url: str, model: str, *, max_tokens: int = 256, system: str | None = None,
                       **endpoint_kwargs: Any) -> Generate:
    """Greedy chat completions from an OpenAI-compatible endpoint, a few requests at a time."""
    return CountingEndpoint(base_url, model, **endpoint_kwargs).generator(max_tokens=max_tokens, system=system)


@dataclass
class CountingEndpoint(Endpoint):
    """An endpoint that adds up the ``usage.completion_tokens`` of its answers: the new tokens of the
    ``generation`` block. None from the first answer without them (meshlm does not guess a count)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._lock, self._completion_tokens = threading.Lock(), 0

    def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        reply = super()._post(route, body)
        usage = reply.get("usage")
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        with self._lock:
            if type(tokens) is not int or self._completion_tokens is None:
                self._completion_tokens = None
            else:
                self._completion_tokens += tokens
        return reply

    def stats(self) -> dict[str, Any]:
        return {"new_tokens": self._completion_tokens}

    def generator(self, **kwargs: Any) -> Generate:
        """``generate(prompts) -> responses`` (:meth:`Endpoint.generate_fn`) with ``stats()``."""
        from meshlm.safety.generation import Measured

        measured = Measured(self.generate_fn(**kwargs))
        measured.generate.stats = self.stats  # type: ignore[attr-defined]  # the new tokens Measured reads
        return measured


def checkpoint_generator(path: str | Path, *, max_new_tokens: int = 128, device: str = "cpu",
                         system: str | None = None, greedy: bool = True, temperature: float = 1.0,
                         seed: int = 0, weights: str = "fp32") -> Generate:
    """Batched generation (greedy by default) from a meshlm checkpoint, each prompt as a one-turn chat in the
    checkpoint's chat template; see :mod:`meshlm.safety.generation`."""
    from meshlm.safety.generation import CheckpointGenerator

    return CheckpointGenerator(path, max_new_tokens=max_new_tokens, device=device, system=system, greedy=greedy,
                               temperature=temperature, seed=seed, weights=weights)
