"""Post-training data pipeline benchmark: encoding rows, packing them, and drawing batches, on the embedded corpus
turned into prompt/completion rows (the first line of each document is the prompt, the rest the completion) and,
for the chat path, two-turn conversations through meshlm's template and through the same template as Jinja.

    python scripts/bench_posttrain_data.py --rows 2000 --seq 512
"""

from __future__ import annotations

import argparse
import json
import time

from meshlm.data import default_cache_dir, embedded_documents, ensure_embedded_dataset
from meshlm.data.posttrain import (
    MESHLM_CHAT_TEMPLATE,
    HFChatTemplate,
    RowEncoder,
    SFTLoader,
    encode_examples,
    pad_id_for,
    parse_row,
)
from meshlm.tokenizer import MeshTokenizer


def _rows(n: int, chat: bool) -> list:
    rows = []
    for i, doc in enumerate(d for d in embedded_documents() if "\n" in d.strip()):
        if len(rows) == n:
            break
        prompt, completion = doc.strip().split("\n", 1)
        if not completion.strip():
            continue
        record = ({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]}
                  if chat else {"prompt": prompt, "completion": completion})
        rows.append(parse_row(record, f"doc:{i}"))
    return rows


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=2048)
    args = p.parse_args()
    dataset = ensure_embedded_dataset(default_cache_dir(), args.vocab, progress=False)
    tok = MeshTokenizer.load(dataset / "tokenizer.json")
    results = {}
    for name, chat, template in (("prompt/completion", False, None), ("chat, meshlm template", True, None),
                                 ("chat, same template as Jinja", True, HFChatTemplate(tok, MESHLM_CHAT_TEMPLATE))):
        rows = _rows(args.rows, chat)
        encoder = RowEncoder(tok, template=template)
        (examples, stats), seconds = _timed(lambda: encode_examples(rows, encoder, args.seq))
        results[name] = {"rows": len(rows), "encode_rows_per_s": round(len(rows) / seconds),
                         "encode_tokens_per_s": round(stats.tokens / seconds), "truncated": stats.truncated_rows}
    for packing in (True, False):
        loader, seconds = _timed(lambda: SFTLoader(examples, args.seq, args.batch, pad_id=pad_id_for(tok),
                                                   packing=packing))
        real = sum(len(e.ids) for e in examples)
        batches = max(1, loader.num_sequences // args.batch)
        _, draw = _timed(lambda: [loader.next_batch() for _ in range(batches)])
        results[f"packing={packing}"] = {
            "rows": "the last encoded set", "sequences": loader.num_sequences, "fill": round(real / (loader.num_sequences * args.seq), 3),
            "plan_s": round(seconds, 3), "batch_tokens_per_s": round(batches * args.batch * args.seq / draw)}
    print(json.dumps({"rows": args.rows, "seq_len": args.seq, "vocab": args.vocab, **results}, indent=1))


if __name__ == "__main__":
    main()
