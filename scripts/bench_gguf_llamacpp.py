"""meshlm's exported GGUF in llama.cpp (through llama-cpp-python): same tokenization and same greedy tokens?

Exports RUN with ``meshlm convert to-gguf`` (f32 and q8_0 by default), then, in the Python that has
llama-cpp-python (a separate virtual environment: it is not a meshlm dependency), tokenizes a few prompts and
generates greedily from meshlm's prompt ids; meshlm generates greedily from the same ids. Prints, per dtype and
prompt, whether llama.cpp's tokenization of the text equals meshlm's and whether the generated ids are equal.

    python scripts/bench_gguf_llamacpp.py RUN [--llama-python /tmp/llamacpp-venv/bin/python] [--dtypes f32,q8_0]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPTS = ["<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
           "Once upon a time, in 2024, there were 3 little pigs"]
NEW_TOKENS = 32

# Runs in llama-cpp-python's interpreter: argv = GGUF path, JSON [{"text", "ids"}], n_new.
_LLAMA_SIDE = r"""
import json, sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=2, verbose=False)
out = []
for item in json.loads(sys.argv[2]):
    tokens = llm.tokenize(item["text"].encode(), add_bos=False, special=True)
    ids = []
    llm.reset()
    for tok in llm.generate(item["ids"], temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0):
        ids.append(int(tok))
        if tok == llm.token_eos() or len(ids) >= int(sys.argv[3]):
            break
    out.append({"tokens": tokens, "ids": ids})
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--llama-python", default="/tmp/llamacpp-venv/bin/python")
    parser.add_argument("--dtypes", default="f32,q8_0")
    args = parser.parse_args()
    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.generate import generate
    from meshlm.interop.gguf_export import convert_to_gguf
    from meshlm.interop.hf_tokenizer import checkpoint_eos_ids
    from meshlm.tokenizer import MeshTokenizer

    model, _, _, ckpt = model_from_checkpoint(args.run)
    tok = MeshTokenizer.load(ckpt / "tokenizer.json")
    tok.backend.encode_special_tokens = False  # the prompts' chat markers are the special tokens here
    items = [{"text": p, "ids": tok.backend.encode(p, add_special_tokens=False).ids} for p in PROMPTS]
    eos = checkpoint_eos_ids(ckpt, tok.eos_id)
    ours = [generate(model, item["ids"], NEW_TOKENS, greedy=True, eos_id=eos) for item in items]
    print(f"load {open('/proc/loadavg').read().split()[:3]}")
    for dtype in args.dtypes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"model-{dtype}.gguf"
            convert_to_gguf(args.run, path, dtype=dtype)
            proc = subprocess.run([args.llama_python, "-c", _LLAMA_SIDE, str(path), json.dumps(items),
                                   str(NEW_TOKENS)], capture_output=True, text=True, check=True)
        theirs = json.loads(proc.stdout.strip().splitlines()[-1])
        for item, mine, other in zip(items, ours, theirs):
            print(f"{dtype}: prompt {item['text'][:40]!r}: tokenization equal {other['tokens'] == item['ids']}, "
                  f"greedy ids equal {other['ids'] == mine} ({len(mine)} tokens; meshlm: {tok.decode(mine)!r})")
            if other["ids"] != mine:
                first = next((i for i, (a, b) in enumerate(zip(mine, other["ids"])) if a != b),
                             min(len(mine), len(other["ids"])))
                print(f"    first difference at token {first}: llama.cpp {tok.decode(other['ids'])!r}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
