"""Prompt-lookup speculative decoding (``--speculative ngram``, meshlm/generate/speculative.py) on real chats.

Each chat is one user turn (the checkpoint's chat template); the reply is decoded greedily up to
``--max-new-tokens`` or an end-of-turn id, by plain greedy and by speculative greedy alternating (``--repeats``
each, medians), and by transformers' ``generate`` on the same weights (greedy, the same stop ids) for the ratio.
Reported per chat: tokens, seconds of each, whether the speculative reply is identical to plain greedy's, and the
draft counts. Chats whose answer repeats the prompt (a rewrite, a correction, code to edit) and chats that do not.

    OMP_NUM_THREADS=2 python scripts/bench_speculative.py --checkpoint /tmp/real/smol [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from meshlm.checkpoint.load import model_from_checkpoint
from meshlm.data.posttrain.templates import chat_template_for
from meshlm.generate import generate
from meshlm.generate.bench import hf_model_from
from meshlm.generate.decode import fast_forward
from meshlm.generate.params import SamplingParams
from meshlm.generate.sampling import RowSampler
from meshlm.generate.speculative import SpeculativeStats, speculative_decode
from meshlm.generate.stops import stop_ids
from meshlm.tokenizer import MeshTokenizer

PARAGRAPH = ("The committee met on Tuesday to discuss the new library budget. Members agreed that the reading room "
             "needs better lighting, that the children's section should open earlier on weekends, and that the old "
             "computers should be replaced before the start of the school year.")
CODE = ("def total(items):\n    result = 0\n    for item in items:\n        if item.price > 0:\n"
        "            result = result + item.price * item.quantity\n    return result\n")
CHATS = {  # name -> (repeats the prompt?, user message)
    "rewrite": (True, f"Rewrite this paragraph in the past perfect tense, changing nothing else:\n\n{PARAGRAPH}"),
    "correct": (True, "Correct the spelling in this text and return the whole text:\n\nThe quick brown fox jumpd "
                      "over the lazy dog. Then the fox ran into the forrest, where it met a bear who was eating "
                      "honey from a tree. The bear and the fox becam friends and shared the honey."),
    "code": (True, f"Add type hints to this Python function and return the full function:\n\n{CODE}"),
    "quote": (True, f"Repeat the following paragraph exactly, then give it a title:\n\n{PARAGRAPH}"),
    "capital": (False, "What is the capital of France, and what is it famous for?"),
    "poem": (False, "Write a short poem about the sea."),
}


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model, _, _, ckpt = model_from_checkpoint(args.checkpoint, "cpu", generates=True)
    tokenizer = MeshTokenizer.load(ckpt / "tokenizer.json")
    template = chat_template_for(tokenizer, ckpt)
    stops = stop_ids(tokenizer, ckpt, template=template)
    fast_forward(model).prepare(1)
    hf = None if args.no_hf else hf_model_from(model)
    rows = []
    for name, (repeats_prompt, message) in CHATS.items():
        prompt = template.encode_prompt([{"role": "user", "content": message}], where=name)
        kw = dict(greedy=True, eos_id=stops, vocab_limit=tokenizer.vocab_size)
        plain_s, spec_s, hf_s = [], [], []
        for _ in range(args.repeats):  # alternating
            t, plain = _timed(lambda: generate(model, prompt, args.max_new_tokens, **kw))
            plain_s.append(t)
            t, spec = _timed(lambda: generate(model, prompt, args.max_new_tokens, speculative="ngram", **kw))
            spec_s.append(t)
            if hf is not None:
                t, _ = _timed(lambda: _hf_greedy(hf, prompt, args.max_new_tokens, stops))
                hf_s.append(t)
        stats = SpeculativeStats()
        with torch.inference_mode():
            greedy = RowSampler(SamplingParams(temperature=0.0), model.cfg.vocab_size)
            speculative_decode(fast_forward(model), model.new_cache(1, len(prompt) + args.max_new_tokens), prompt,
                               args.max_new_tokens, set(stops), greedy, vocab_limit=tokenizer.vocab_size, stats=stats)
        row = {"chat": name, "repeats_prompt": repeats_prompt, "prompt_tokens": len(prompt), "tokens": len(plain),
               "identical": spec == plain, "plain_s": statistics.median(plain_s),
               "speculative_s": statistics.median(spec_s), "forwards": stats.forwards, "drafted": stats.drafted,
               "accepted": stats.accepted, "load": os.getloadavg()[0]}
        row["speedup"] = row["plain_s"] / row["speculative_s"]
        if hf_s:
            row["hf_s"] = statistics.median(hf_s)
            row["speculative_to_hf"] = row["hf_s"] / row["speculative_s"]
            row["plain_to_hf"] = row["hf_s"] / row["plain_s"]
        rows.append(row)
        print(json.dumps(row) if args.json else
              f"{name:8} {len(plain):3} tokens, identical {row['identical']}: plain {row['plain_s']:.2f} s, "
              f"speculative {row['speculative_s']:.2f} s ({row['speedup']:.2f}x; {stats.accepted}/{stats.drafted} "
              f"drafted accepted, {stats.forwards} forwards)"
              + (f", HF {row['hf_s']:.2f} s" if hf_s else "") + f", load {row['load']:.1f}", flush=True)


def _hf_greedy(hf, prompt: list[int], max_new_tokens: int, stops: list[int]) -> list[int]:
    from transformers import GenerationConfig

    ids = torch.tensor([prompt])
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(stops), pad_token_id=0)
    with torch.inference_mode():
        out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=cfg)
    return out[0, len(prompt):].tolist()


if __name__ == "__main__":
    main()
