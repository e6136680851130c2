"""Gemma 3 270M from its GGUF through ``meshlm convert from-gguf``, checked against transformers' own GGUF loader
(``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``, which dequantises to fp32).

1. ``convert_from_gguf(FILE, RUN)``: wall time;
2. tokenization: meshlm's rebuilt tokenizer vs transformers' on a few hundred strings (words, leading spaces,
   runs of spaces and newlines, tabs and control characters, emoji, CJK, accents, HTML): how many agree, the
   first disagreements;
3. logits: max |Δ| on a few prompts, one of them longer than the 512-token sliding window;
4. greedy continuations of a prompt: meshlm's ``generate``, argmax over meshlm's full forward, transformers'
   ``generate`` (a check that the norms were read as the model wants them: a wrong (1 + w) offset gives text
   unrelated to the prompt).

    python scripts/bench_gemma3.py [FILE.gguf] [--run DIR] [--strings 400] [--json]

FILE defaults to where ``meshlm fetch gemma3-270m`` puts it. Runs on CPU in fp32 (about 2-3 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "  Leading spaces, tabs\tand\n\nnewlines 🙂 中文",
           "Once upon a time, in a small village by the sea,"]
SAMPLES = ["hello", "world", " the", "Paris", "naïve", "café", "東京", "中文字符", "日本語", "한국어", "🙂", "🤖🧠",
           "👩‍👩‍👧", "\n", "\n\n", "\t", "  ", "   ", "\x01", "\x7f", "\u200b", "12345", "3.14159", "$56.78",
           "<div>", "</div>", "it's", "we'll", "Ünïcödé", "ﬁ", "\r\n", "—", "«»", "x" * 40, "def f(x):", "𝔘𝔫𝔦"]


def strings(n: int, seed: int = 0) -> list[str]:
    """``n`` strings made of SAMPLES joined by nothing, a space or a newline (deterministic)."""
    rng = random.Random(seed)
    out = list(SAMPLES)
    while len(out) < n:
        parts = rng.choices(SAMPLES, k=rng.randint(1, 8))
        out.append("".join(p + rng.choice(["", " ", "  ", "\n"]) for p in parts))
    return out[:n]


def transformers_side(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return tok, model.eval()


def tokenization(ours, theirs, texts: list[str]) -> dict:
    """Agreement of the two tokenizers (bos included, as both add it) and of the decoded texts."""
    wrong, decoded_wrong = [], 0
    for text in texts:
        a = ours.backend.encode(text, add_special_tokens=True).ids
        b = theirs(text)["input_ids"]
        if a != b:
            wrong.append({"text": text, "meshlm": a, "transformers": b})
        decoded_wrong += ours.decode(a, skip_special_tokens=True) != theirs.decode(b, skip_special_tokens=True)
    return {"strings": len(texts), "equal": len(texts) - len(wrong), "decoded_differently": decoded_wrong,
            "first_differences": wrong[:3]}


def logits_diff(model, ref, tok, texts: list[str]) -> list[dict]:
    out = []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tok.prompt_ids(text)])  # bos + text, as transformers' tokenizer gives it
            ours, theirs = model(ids).float(), ref(ids).logits.float()
            out.append({"tokens": ids.shape[1], "max_abs_logit_diff": (ours - theirs).abs().max().item(),
                        "argmax_equal": bool((ours.argmax(-1) == theirs.argmax(-1)).all())})
    return out


def greedy(model, ref, tok, text: str, eos_ids: list[int], generate, n_new: int = 12) -> dict:
    """Greedy continuations of ``text``: meshlm's ``generate`` (its decode path), argmax over meshlm's full forward
    (no cache), and transformers' ``generate``."""
    prompt = tok.prompt_ids(text)
    cached = generate(model, prompt, n_new, greedy=True, eos_id=eos_ids)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n_new):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
            if ids[-1] in eos_ids:
                break
        theirs = ref.generate(torch.tensor([prompt]), max_new_tokens=n_new, do_sample=False)[0, len(prompt):]
    forward = ids[len(prompt):]
    return {"prompt": text, "meshlm_generate": tok.decode(cached), "meshlm_forward": tok.decode(forward),
            "transformers": tok.decode(theirs.tolist()), "forward_equals_transformers": forward == theirs.tolist(),
            "generate_equals_forward": cached == forward}


def main() -> None:
    from meshlm.cli.fetch import model_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", default=str(model_path("gemma3-270m")))
    parser.add_argument("--run", default=None, help="where to write the converted run (default: a temp folder)")
    parser.add_argument("--strings", type=int, default=400)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.data import embedded_documents
    from meshlm.generate import generate
    from meshlm.interop.gguf import convert_from_gguf
    from meshlm.interop.hf_tokenizer import checkpoint_eos_ids
    from meshlm.tokenizer import MeshTokenizer

    torch.manual_seed(0)
    source = Path(args.gguf)
    run = Path(args.run) if args.run else Path(tempfile.mkdtemp(prefix="bench-gemma3-")) / "run"
    report: dict = {"file": str(source), "load": open("/proc/loadavg").read().split()[:3]}
    start = time.perf_counter()
    converted = convert_from_gguf(source, run, overwrite=True)
    report["from_gguf"] = {"wall_s": round(time.perf_counter() - start, 1), "notes": converted["notes"]}
    model, _, _, ckpt = model_from_checkpoint(run)
    tok = MeshTokenizer.load(ckpt / "tokenizer.json")
    ref_tok, ref = transformers_side(source)
    report["tokenization"] = tokenization(tok, ref_tok, strings(args.strings))
    long_text = " ".join(embedded_documents())[:4000]  # about 900 tokens: past the 512-token window
    report["logits"] = logits_diff(model, ref, tok, PROMPTS + [long_text])
    report["greedy"] = greedy(model, ref, tok, PROMPTS[0], checkpoint_eos_ids(ckpt, tok.eos_id), generate)
    report["load_after"] = open("/proc/loadavg").read().split()[:3]
    if args.json:
        print(json.dumps(report, indent=1, ensure_ascii=False))
        return
    for key, value in report.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
