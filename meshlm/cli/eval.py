"""``meshlm eval safety``: generate on evaluation prompts, judge the responses, report rates with CIs, gate.

    meshlm eval safety (--checkpoint RUN | --endpoint URL --model NAME) --prompts FILE.jsonl --out DIR
                       [--json] [--gate EXPR] [--guard PATH] [--judge NAME[:ARG]]

``--judge`` takes any judge plug-in (meshlm/safety/judges/): rule, encoder[:DIR] (no DIR: the shipped adapter
judge), trained:DIR, llm:URL#MODEL.

Writes DIR/responses.jsonl, DIR/report.json and DIR/report.md; ``--json`` prints the report. Exit 1 when a
gate fails (the report records every gate), 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys

from meshlm.cli import eval_facts
from meshlm.cli.jsonout import emit
from meshlm.errors import ConfigError
from meshlm.safety.judges import add_judge_arguments


def register(sub, add_config_args) -> None:
    p = sub.add_parser("eval", help="evaluate a model (safety: judged refusal/false-refusal/warn/attack "
                                    "rates; facts: factual accuracy)")
    group = p.add_subparsers(dest="eval_command", required=True, metavar="WHAT")
    s = group.add_parser("safety", help="judged safety evaluation with Wilson CIs and gates",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a run directory (newest valid checkpoint) or a step folder")
    src.add_argument("--endpoint", help="an OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    s.add_argument("--model", help="the model name at --endpoint")
    s.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    s.add_argument("--prompts", required=True, help="JSONL rows {prompt, expected, category?, family?}")
    s.add_argument("--out", required=True, help="output folder")
    add_judge_arguments(s)
    s.add_argument("--guard", help="a guard saved by `meshlm judge --train-guard`: report model + guard too")
    s.add_argument("--gate", action="append", default=[], metavar="EXPR",
                   help="e.g. refusal_rate>=0.95,false_refusal_rate<=0.05 (repeatable); exit 1 if one fails")
    s.add_argument("--max-new-tokens", type=int, default=128)
    s.add_argument("--batch-size", type=int, default=32, help="prompts generated together")
    s.add_argument("--system", help="a system prompt for every conversation")
    s.add_argument("--device", default="cpu")
    s.add_argument("--limit", type=int, help="evaluate only the first N prompts")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.set_defaults(handler=run_safety)
    eval_facts.add_parser(group)  # meshlm eval facts: factual accuracy (meshlm/safety/usefulness.py)


def run_safety(args: argparse.Namespace) -> int:
    from meshlm.safety.evaluate import (evaluate_safety,
                                        read_prompt_rows, write_outputs)
    from meshlm.safety.judges import judge_options, make_judge
    from meshlm.safety.metrics import DEGENERACY, HEADLINE, parse_gates

    if args.endpoint and not args.model:
        raise ConfigError("--endpoint needs --model NAME (the model to ask at that endpoint)")
    if args.model and not args.endpoint:
        raise ConfigError("--model names a model at an --endpoint; with --checkpoint leave it out")
    if args.max_new_tokens < 1 or args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        raise ConfigError("--max-new-tokens, --batch-size and --limit must be at least 1")
    parse_gates(args.gate)  # a mistyped gate fails before any generation
    rows = read_prompt_rows(args.prompts)[:args.limit]
    judge = make_judge(args.judge, judge_options(args))
    guard = None
    if args.guard:
        from meshlm.safety.guard import Guard

        guard = Guard.load(args.guard)
    generate, source = generator_from_args(args)
    report = evaluate_safety(rows, generate, judge, guard, args.gate, batch_size=args.batch_size,
                             progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    report = {"source": source, "prompts_file": args.prompts, **report}
    write_outputs(report, args.out)
    body = {k: v for k, v in report.items() if k != "records"}
    if args.json:
        emit(body)
    else:
        for name in HEADLINE + DEGENERACY:
            stat = body[name]
            lo, hi = stat["ci95"]
            value = "-" if stat["rate"] is None else f"{stat['rate']:.3f} [{lo:.3f}, {hi:.3f}]"
            print(f"{name:>20}: {value} (n={stat['n']})")
        for gate in body["gates"]:
            print(f"gate {gate['gate']}: {'pass' if gate['passed'] else 'FAIL ' + gate.get('reason', '')}")
        gen = body["generation"]
        print(f"generation: {gen['prompts']} prompts in {gen['seconds']:.1f} s, {gen['new_tokens']} new tokens, "
              f"{gen['tokens_per_s']} tokens/s")
        print(f"wrote {args.out}/responses.jsonl, report.json, report.md")
    return 0 if body["passed"] else 1


def generator_from_args(args: argparse.Namespace):
    """(generate, source) for --checkpoint or --endpoint/--model (shared by eval safety and eval facts)."""
    from meshlm.safety.evaluate import checkpoint_generator, endpoint_generator

    if args.checkpoint:
        generate = checkpoint_generator(args.checkpoint, max_new_tokens=args.max_new_tokens, device=args.device,
                                        system=args.system)
        return generate, args.checkpoint
    generate = endpoint_generator(args.endpoint, args.model, max_tokens=args.max_new_tokens,
                                  system=args.system, api_key_env=args.api_key_env)
    return generate, f"{args.endpoint}#{args.model}"
