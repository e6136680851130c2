"""``meshlm prepare``: text/JSONL/Parquet files or folders → tokenized shards + manifest + tokenizer."""

from __future__ import annotations

import argparse


def register(sub, add_config_args) -> None:
    p = sub.add_parser("prepare", help="tokenize a corpus into memmap shards (training a BPE tokenizer unless "
                                       "--tokenizer is given)")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help=".txt/.md, .jsonl, .parquet files or folders")
    p.add_argument("--out", required=True, help="output folder (must not exist or be empty, unless --overwrite)")
    p.add_argument("--tokenizer", help="an existing tokenizer.json to use instead of training one")
    p.add_argument("--vocab-size", type=int, default=8192, help="BPE vocabulary size incl. special tokens")
    p.add_argument("--val-fraction", type=float, default=0.01, help="share of documents held out for eval")
    p.add_argument("--workers", type=int, default=2, help="tokenizer worker processes")
    p.add_argument("--text-field", default="text", help="JSONL key / Parquet column holding the text")
    p.add_argument("--overwrite", action="store_true", help="replace an existing prepared folder")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from meshlm.data import prepare_dataset
    from meshlm.errors import ConfigError
    from meshlm.tokenizer import MIN_VOCAB_SIZE

    if args.vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError(f"--vocab-size {args.vocab_size} is too small: byte-level BPE needs 256 byte tokens "
                          f"plus the special tokens; use at least {MIN_VOCAB_SIZE}")
    if not 0 <= args.val_fraction < 1:
        raise ConfigError(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    manifest = prepare_dataset(args.inputs, args.out, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
                               val_fraction=args.val_fraction, num_workers=args.workers,
                               text_field=args.text_field, overwrite=args.overwrite)
    splits = manifest["splits"]
    print(f"prepared {args.out}: " + ", ".join(
        f"{name} {s['documents']:,} docs / {s['tokens']:,} tokens" for name, s in splits.items())
        + f"; vocab {manifest['vocab_size']}, dtype {manifest['dtype']}")
    if manifest.get("skipped_non_utf8"):
        print(f"skipped {manifest['skipped_non_utf8']} document(s) that were not valid UTF-8")
    return 0
