"""``meshlm generate``: sample from a checkpoint with a KV cache, from a plain prompt or a chat.

A plain ``--prompt`` starts with bos only where the checkpoint's tokenizer adds one (SmolLM2's bos is the chat
marker ``<|im_start|>``, which a plain prompt must not begin with; see ``MeshTokenizer.add_bos``). ``--chat`` /
``--messages`` render the conversation with the checkpoint's own chat template (a converted model's Jinja
template, meshlm's for models trained here), stop at any eos id or at the template's end-of-turn token, and print
the assistant's reply only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from meshlm.cli.jsonout import emit
from meshlm.errors import ConfigError, DataError


def register(sub, add_config_args) -> None:
    p = sub.add_parser("generate", help="sample text from a checkpoint (a plain prompt or a chat)")
    p.add_argument("--checkpoint", required=True, help="a run directory (newest valid checkpoint) or a step folder")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text (bos first only where the tokenizer adds one)")
    src.add_argument("--prompt-ids", help="prompt token ids, comma separated, e.g. 1,2,3")
    src.add_argument("--chat", metavar="TEXT", help="a user message, answered through the checkpoint's chat template")
    src.add_argument("--messages", metavar="FILE.json",
                     help='a conversation to answer: a JSON list of {"role": system|user|assistant, "content": ...}')
    p.add_argument("--system", metavar="TEXT", help="with --chat: a system message before it")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0: off)")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--weights", default="fp32", choices=("fp32", "int8", "int4"),
                   help="int8: decode steps on int8 copies of the weights (CPU; faster, not the same logits; "
                        "docs/model.md, 'int8 decode weights'); int4: 4-bit copies (CPU, "
                        "faster still, further from fp32; 'Speed levers')")
    p.add_argument("--speculative", choices=("ngram",), default=None,
                   help="ngram: draft tokens from the prompt and output so far and verify them in one forward (the "
                        "same tokens, greedy or sampled with a seed; faster where the reply repeats the prompt; "
                        "docs/model.md, 'Speed levers')")
    p.add_argument("--json", action="store_true", help="print {text, ids, ...} per sample as JSON lines")
    p.set_defaults(handler=run)


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise ConfigError(f"--prompt-ids {text!r}: expected comma-separated integers, e.g. 1,2,3") from None
    if not ids:
        raise ConfigError("--prompt-ids is empty; give at least one token id")
    return ids


def read_messages(path: str) -> list[dict[str, str]]:
    """The conversation of a --messages file, validated like a data row's messages; it must not end with the
    assistant (there would be no reply to write)."""
    from meshlm.data.posttrain.rows import parse_row

    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"--messages {file} does not exist; pass a JSON file holding a list of "
                        '{"role", "content"} messages') from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"--messages {file} is not readable JSON ({exc}); it must hold a list of "
                        '{"role", "content"} messages') from None
    if not isinstance(data, list):
        raise DataError(f"--messages {file} holds a JSON {type(data).__name__}; it must hold a list of "
                        '{"role", "content"} messages')
    messages = parse_row({"prompt": data}, str(file)).prompt
    if messages[-1]["role"] == "assistant":
        raise DataError(f"--messages {file}: the last message is the assistant's; end with a user message to get "
                        "a reply")
    return messages


def chat_messages(args: argparse.Namespace) -> list[dict[str, str]] | None:
    """The conversation of --chat [--system] or --messages; None for a plain prompt."""
    if args.system is not None and args.chat is None:
        raise ConfigError("--system goes with --chat; with --messages put the system message in the file")
    if args.messages:
        return read_messages(args.messages)
    if args.chat is None:
        return None
    if not args.chat.strip():
        raise ConfigError("--chat is empty; give the user's message")
    system = [{"role": "system", "content": args.system}] if args.system else []
    return system + [{"role": "user", "content": args.chat}]


def run(args: argparse.Namespace) -> int:
    from meshlm.checkpoint.load import model_from_checkpoint
    from meshlm.data.posttrain.templates import chat_template_for
    from meshlm.generate import generate
    from meshlm.generate.decode import FastForward, fast_forward
    from meshlm.generate.stops import split_stop, stop_ids
    from meshlm.tokenizer import MeshTokenizer

    if args.max_new_tokens < 1 or args.num_samples < 1:
        raise ConfigError("--max-new-tokens and --num-samples must be at least 1")
    if args.speculative and args.weights != "fp32":
        raise ConfigError(f"--speculative {args.speculative} verifies on fp32 weights: keep --weights fp32, or drop "
                          "--speculative")
    messages = chat_messages(args)
    model, cfg, _, ckpt = model_from_checkpoint(args.checkpoint, args.device, generates=True)
    tokenizer = MeshTokenizer.load(ckpt / "tokenizer.json")
    eos_ids = stop_ids(tokenizer, ckpt, chat=False)  # e.g. Llama 3.1 Instruct ends turns with several
    if messages is not None:
        template = chat_template_for(tokenizer, ckpt)
        prompt = template.encode_prompt(messages, where="the chat")
        eos_ids = stop_ids(tokenizer, ckpt, template=template)  # + <|im_end|>, meshlm's <|end|>
    elif args.prompt_ids:
        prompt = parse_ids(args.prompt_ids)
        bad = [i for i in prompt if not 0 <= i < cfg.model.vocab_size]
        if bad:
            raise ConfigError(f"--prompt-ids: {bad[0]} is outside the vocabulary [0, {cfg.model.vocab_size})")
    else:
        prompt = tokenizer.prompt_ids(args.prompt or "")
        if not prompt:
            raise ConfigError("--prompt is empty and this tokenizer adds no bos token; give some prompt text")
    forward = fast_forward(model, args.weights)
    if isinstance(forward, FastForward):
        forward.prepare(1)  # the packs, once at load: no sample pays for them
    for i in range(args.num_samples):
        new = generate(model, prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, greedy=args.greedy, eos_id=eos_ids, seed=args.seed + i,
                       device=args.device, vocab_limit=tokenizer.vocab_size, weights=args.weights,
                       speculative=args.speculative)
        ids = prompt + new
        body, stopped = split_stop(new, eos_ids)  # the stop token ends the sample; no text of it is printed
        reply = tokenizer.decode(body, skip_special_tokens=True).strip()
        if args.json:  # "text" is what the command prints: the reply in a chat, prompt and completion otherwise
            emit({"ids": ids, "text": reply if messages is not None else tokenizer.decode(prompt + body),
                  "prompt_ids": prompt, "generated_ids": new, "completion": tokenizer.decode(body),
                  "eos_ids": eos_ids, "finish_reason": "stop" if stopped else "length"})  # one JSON line per sample
        else:
            print(reply if messages is not None else tokenizer.decode(prompt + body, skip_special_tokens=True))
    return 0
