"""``meshlm eval facts``: factual accuracy of a model (does it still answer plain questions?).

    meshlm eval facts (--checkpoint RUN | --endpoint URL --model NAME) --out DIR [--questions FILE.jsonl]
                      [--max-new-tokens N] [--batch-size N] [--limit N] [--system TEXT] [--json]

Questions default to the embedded ``meshlm/safety/data/factual_qa.jsonl``; a response is correct when it holds
one of the row's accepted answers as a whole word (case-insensitive). Writes DIR/responses.jsonl, report.json and
report.md (meshlm/safety/usefulness.py); ``--json`` prints the report. Exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys

from meshlm.cli.jsonout import emit
from meshlm.errors import ConfigError


def add_parser(group) -> None:
    f = group.add_parser("facts", help="factual accuracy on short questions with accepted answers (Wilson CI)",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = f.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a run directory (newest valid checkpoint) or a step folder")
    src.add_argument("--endpoint", help="an OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    f.add_argument("--model", help="the model name at --endpoint")
    f.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    f.add_argument("--questions", help="JSONL rows {id, question, answers, topic?} (default: the embedded set)")
    f.add_argument("--out", required=True, help="output folder")
    f.add_argument("--max-new-tokens", type=int, default=48)
    f.add_argument("--batch-size", type=int, default=32, help="questions generated together")
    f.add_argument("--system", help="a system prompt for every conversation")
    f.add_argument("--device", default="cpu")
    f.add_argument("--limit", type=int, help="ask only the first N questions")
    f.add_argument("--json", action="store_true", help="print the report as JSON")
    f.set_defaults(handler=run_facts)


def run_facts(args: argparse.Namespace) -> int:
    from meshlm.safety.usefulness import evaluate_facts, read_questions, write_fact_outputs

    if bool(args.endpoint) != bool(args.model):
        raise ConfigError("--endpoint and --model go together (the model to ask at that endpoint); with "
                          "--checkpoint leave --model out")
    if args.max_new_tokens < 1 or args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        raise ConfigError("--max-new-tokens, --batch-size and --limit must be at least 1")
    rows = read_questions(args.questions)[:args.limit]
    from meshlm.cli.eval import generator_from_args

    generate, source = generator_from_args(args)
    report = evaluate_facts(rows, generate, batch_size=args.batch_size,
                            progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    report = {"source": source, "questions_file": args.questions or "embedded", **report}
    write_fact_outputs(report, args.out)
    body = {k: v for k, v in report.items() if k != "records"}
    if args.json:
        emit(body)
    else:
        acc = body["accuracy"]
        print(f"accuracy: {acc['rate']:.3f} [{acc['ci95'][0]:.3f}, {acc['ci95'][1]:.3f}] "
              f"({acc['k']}/{acc['n']}) in {body['generate_s']:.0f} s ({body['new_tokens']} new tokens, "
              f"{body['tokens_per_s']} tokens/s)")
        print(f"wrote {args.out}/responses.jsonl, report.json, report.md")
    return 0
