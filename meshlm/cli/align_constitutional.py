"""``meshlm align constitutional``: answer, critique against the spec's principles and revise (the supervised stage
of Constitutional AI, meshlm/safety/constitutional.py), writing SFT rows and preference pairs. Mounted by
meshlm/cli/align.py."""

from __future__ import annotations

import argparse
from typing import Any

from meshlm.cli.jsonout import emit
from meshlm.errors import DataError


def add_parser(align_subparsers: Any) -> argparse.ArgumentParser:
    """``meshlm align constitutional``, mounted by meshlm/cli/align.py."""
    p = align_subparsers.add_parser("constitutional", help="answer, critique against the spec's principles and "
                                                           "revise; write SFT rows and preference pairs")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a meshlm run directory or checkpoint folder")
    src.add_argument("--endpoint", help="an OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", help="the endpoint's model name")
    p.add_argument("--spec", help="a behaviour spec (default: the embedded one)")
    p.add_argument("--prompts", help="JSONL rows {prompt, category?} (default: every seed prompt of the spec)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--revisions", type=int, default=1, help="critique/revision rounds per prompt")
    p.add_argument("--limit", type=int, help="use the first N prompts only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--batch-size", type=int, default=8, help="prompts decoded together (checkpoint)")
    p.add_argument("--max-quote-chars", type=int, help="cut the answer/critique quoted in the critique and revision "
                                                       "requests to N characters (for endpoints with a small context)")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace) -> int:
    from meshlm.safety.chatgen import checkpoint_generate_fn, generate_fn
    from meshlm.safety.constitutional import critique_and_revise, items_from_spec, read_items, write_result
    from meshlm.safety.spec import load_spec

    spec = load_spec(args.spec)
    items = read_items(args.prompts, spec) if args.prompts else items_from_spec(spec)
    if args.max_quote_chars is not None and args.max_quote_chars < 1:
        raise DataError(f"--max-quote-chars must be at least 1, got {args.max_quote_chars}")
    if args.limit is not None:
        if args.limit < 1:
            raise DataError(f"--limit must be at least 1, got {args.limit}")
        items = items[:args.limit]
    if args.endpoint:
        generate = generate_fn(args.endpoint, args.model, max_new_tokens=args.max_new_tokens,
                               temperature=args.temperature, flag="--endpoint", model_flag="--model")
    else:
        generate = checkpoint_generate_fn(args.checkpoint, max_new_tokens=args.max_new_tokens,
                                          temperature=args.temperature, seed=args.seed, batch_size=args.batch_size)
    result = critique_and_revise(items, generate, spec.principles(), revisions=args.revisions, seed=args.seed,
                                 max_quote_chars=args.max_quote_chars)
    manifest = write_result(result, args.out, {"model": args.endpoint or args.checkpoint,
                                               "endpoint_model": args.model, "revisions": args.revisions,
                                               "seed": args.seed, "spec_version": getattr(spec, "version", None)})
    if args.json:
        emit(manifest, indent=1)
    else:
        print(f"{manifest['sft_rows']} SFT rows and {manifest['preference_pairs']} preference pairs from "
              f"{manifest['prompts']} prompts in {args.out}")
    return 0
