"""``meshlm generate``: sample from a checkpoint with a KV cache."""

from __future__ import annotations

import argparse

from meshlm.cli.jsonout import emit
from meshlm.errors import CheckpointError, ConfigError


def register(sub, add_config_args) -> None:
    p = sub.add_parser("generate", help="sample text from a checkpoint")
    p.add_argument("--checkpoint", required=True, help="a run directory (newest valid checkpoint) or a step folder")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-ids", help="prompt token ids, comma separated, e.g. 1,2,3")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0: off)")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true", help="print {ids, text, ...} per sample as JSON lines")
    p.set_defaults(handler=run)


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise ConfigError(f"--prompt-ids {text!r}: expected comma-separated integers, e.g. 1,2,3") from None
    if not ids:
        raise ConfigError("--prompt-ids is empty; give at least one token id")
    return ids


def run(args: argparse.Namespace) -> int:
    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.generate import generate
    from meshlm.interop.hf_tokenizer import checkpoint_eos_ids
    from meshlm.tokenizer import MeshTokenizer

    if args.max_new_tokens < 1 or args.num_samples < 1:
        raise ConfigError("--max-new-tokens and --num-samples must be at least 1")
    model, cfg, _, ckpt = model_from_checkpoint(args.checkpoint, args.device)
    if cfg.training.objective == "reward":
        raise CheckpointError(f"{ckpt} is a reward model (a score head, no vocabulary head): it scores sequences "
                              "and cannot generate; pass a policy checkpoint")
    tokenizer = MeshTokenizer.load(ckpt / "tokenizer.json")
    if args.prompt_ids:
        prompt = parse_ids(args.prompt_ids)
        bad = [i for i in prompt if not 0 <= i < cfg.model.vocab_size]
        if bad:
            raise ConfigError(f"--prompt-ids: {bad[0]} is outside the vocabulary [0, {cfg.model.vocab_size})")
    else:
        bos = [tokenizer.bos_id] if tokenizer.bos_id is not None else []  # e.g. Qwen's tokenizer has no bos
        prompt = bos + tokenizer.encode(args.prompt or "")
    eos_ids = checkpoint_eos_ids(ckpt, tokenizer.eos_id)  # e.g. Llama 3.1 Instruct ends turns with several
    for i in range(args.num_samples):
        new = generate(model, prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, greedy=args.greedy, eos_id=eos_ids, seed=args.seed + i,
                       device=args.device, vocab_limit=tokenizer.vocab_size)
        ids = prompt + new
        if args.json:
            emit({"ids": ids, "text": tokenizer.decode(ids), "prompt_ids": prompt, "generated_ids": new,
                  "completion": tokenizer.decode(new), "eos_ids": eos_ids})  # one JSON line per sample
        else:
            print(tokenizer.decode(ids, skip_special_tokens=True))
    return 0
