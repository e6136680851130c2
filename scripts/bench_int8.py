"""What int8 decode weights (``--weights int8``, meshlm/generate/int8.py) cost in accuracy on a real checkpoint.

1. Logits, one row: for the first N embedded factual questions as one-turn chats, each path prefills the prompt
   with its own weights, then the fp32 greedy continuation (``--tokens`` ids) is fed to both (teacher forcing);
   reported: the relative L2 error of int8's logits against fp32's at the first token (the prefill's) and over
   the steps, how often their top-1 ids agree, and where int8's own greedy continuation first leaves fp32's.
2. Factual accuracy (``--facts``): every embedded factual question (meshlm/safety/data), answered greedily in
   batches of ``--batch-size`` rows by the evaluation's generator with fp32 and with int8 weights (a batch shares
   one activation scale per product: the batch effect is in this figure).

    python scripts/bench_int8.py --checkpoint /tmp/runs/smol [--weights int4] [--facts] [--json]

``--weights int4`` measures the 4-bit weights (meshlm/generate/int4.py) the same way (the "int8" of the labels).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from meshlm.generate.decode import FastForward
from meshlm.safety.evaluate import checkpoint_generator
from meshlm.safety.generation import CheckpointGenerator
from meshlm.safety.usefulness import evaluate_facts, read_questions


def _steps(model, prompt: list[int], tokens: list[int], fp32: FastForward, int8: FastForward):
    """Teacher-forced errors and agreement over ``tokens``; int8's free-running divergence index."""
    n = len(tokens)
    caches = [model.new_cache(1, len(prompt) + n) for _ in range(3)]
    ids = torch.tensor([prompt])
    want = fp32(ids, cache=caches[0], start_pos=0)[0, -1]
    first = int8(ids, cache=caches[1], start_pos=0)[0, -1]
    int8(ids, cache=caches[2], start_pos=0)
    first_error = float((first - want).norm() / want.norm())
    errors, agree, free = [], 0, [int(first.argmax())]
    for i in range(n - 1):
        pos, step = len(prompt) + i, torch.tensor([[tokens[i]]])
        a, b = fp32(step, cache=caches[0], start_pos=pos)[0, -1], int8(step, cache=caches[1], start_pos=pos)[0, -1]
        errors.append(float((a - b).norm() / a.norm()))
        agree += int(a.argmax() == b.argmax())
        free.append(int(int8(torch.tensor([[free[-1]]]), cache=caches[2], start_pos=pos)[0, -1].argmax()))
    diverge = next((i for i, (x, y) in enumerate(zip(free, tokens)) if x != y), n)
    return statistics.mean(errors), agree / (n - 1), diverge, first_error


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--facts", action="store_true")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--weights", choices=("int8", "int4"), default="int8", help="the format compared with fp32")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    gen = CheckpointGenerator(args.checkpoint, max_new_tokens=args.tokens)
    model = gen.model
    fp32, int8 = FastForward(model), FastForward(model, args.weights)
    questions = read_questions()
    rows = []
    with torch.inference_mode():
        for q in questions[:args.prompts]:
            prompt = gen.prompt_ids(q["question"])
            tokens, _ = [], None
            cache = model.new_cache(1, len(prompt) + args.tokens)
            logits = fp32(torch.tensor([prompt]), cache=cache, start_pos=0)
            for i in range(args.tokens):
                tokens.append(int(logits[0, -1].argmax()))
                if i + 1 < args.tokens:
                    logits = fp32(torch.tensor([[tokens[-1]]]), cache=cache, start_pos=len(prompt) + i)
            rows.append(_steps(model, prompt, tokens, fp32, int8))
    result = {"checkpoint": args.checkpoint, "weights": args.weights, "prompts": len(rows), "tokens": args.tokens,
              "logits_rel_error_mean": statistics.mean(r[0] for r in rows),
              "first_token_rel_error_mean": statistics.mean(r[3] for r in rows),
              "top1_agreement": statistics.mean(r[1] for r in rows),
              "free_run_divergence": [r[2] for r in rows],
              "identical_continuations": sum(r[2] == args.tokens for r in rows)}
    if args.facts:
        for weights in ("fp32", "int8"):
            generate = checkpoint_generator(args.checkpoint, max_new_tokens=args.max_new_tokens,
                                            weights=args.weights if weights == "int8" else weights)
            report = evaluate_facts(questions, generate, batch_size=args.batch_size)
            result[f"facts_{weights}"] = {**report["accuracy"], "generate_s": report["generate_s"]}
            result[f"_records_{weights}"] = [r["correct"] for r in report["records"]]
        a, b = result.pop("_records_fp32"), result.pop("_records_int8")
        result["facts_changed_answers"] = {"fp32_only": sum(x and not y for x, y in zip(a, b)),
                                           "int8_only": sum(y and not x for x, y in zip(a, b))}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['prompts']} chat prompts, {args.tokens} tokens: {args.weights} logits relative error "
          f"{result['first_token_rel_error_mean']:.3f} at the first token, {result['logits_rel_error_mean']:.3f} "
          f"over the steps, top-1 agreement {result['top1_agreement']:.3f}, identical "
          f"greedy continuations {result['identical_continuations']}/{result['prompts']}, first divergence "
          f"{result['free_run_divergence']}")
    for weights in ("fp32", "int8"):
        if f"facts_{weights}" in result:
            f = result[f"facts_{weights}"]
            print(f"facts {weights}: {f['rate']:.3f} [{f['ci95'][0]:.3f}, {f['ci95'][1]:.3f}] ({f['k']}/{f['n']}), "
                  f"{f['generate_s']:.0f} s")
    if "facts_changed_answers" in result:
        print(f"answers right in fp32 only / int8 only: {result['facts_changed_answers']}")


if __name__ == "__main__":
    main()
