"""``meshlm convert from-hf HF_DIR OUT``, ``to-hf CHECKPOINT OUT_DIR``, ``from-gguf FILE.gguf OUT`` and
``to-gguf CHECKPOINT OUT.gguf``."""

from __future__ import annotations

import argparse

from meshlm.cli.jsonout import emit


def register(sub, add_config_args) -> None:
    p = sub.add_parser("convert", help="convert checkpoints to and from Hugging Face and GGUF formats")
    conv = p.add_subparsers(dest="direction", required=True, metavar="DIRECTION")

    src = conv.add_parser("from-hf", help="a local HF model folder -> a meshlm run directory")
    src.add_argument("hf_dir", metavar="HF_DIR", help="folder with config.json, *.safetensors and tokenizer.json")
    src.add_argument("out", metavar="OUT", help="the run directory to create (config.resolved.toml + checkpoints/)")
    src.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    src.add_argument("--json", action="store_true", help="print the result as JSON")
    src.set_defaults(handler=run_from_hf)

    dst = conv.add_parser("to-hf", help="a meshlm checkpoint -> an HF model folder (from_pretrained loads it)")
    dst.add_argument("checkpoint", metavar="CHECKPOINT", help="a run directory (newest valid checkpoint) or a "
                     "step folder, written by any parallel layout")
    dst.add_argument("out_dir", metavar="OUT_DIR", help="the HF folder to create")
    dst.add_argument("--max-shard-size", default="5GB", help="split model.safetensors into shards of at most "
                     "this size (5GB = 5*10^9 bytes, 5GiB = 5*2^30), with model.safetensors.index.json")
    dst.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"),
                     help="dtype of the written weights (config.json's torch_dtype says the same)")
    dst.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    dst.add_argument("--adapter-only", action="store_true", help="a LoRA checkpoint: write only the PEFT adapter "
                     "(adapter_config.json, adapter_model.safetensors) instead of the merged model")
    dst.add_argument("--json", action="store_true", help="print the result as JSON")
    dst.set_defaults(handler=run_to_hf)

    gin = conv.add_parser("from-gguf", help="a GGUF file (llama.cpp, ollama, LM Studio) -> a meshlm run directory")
    gin.add_argument("gguf_file", metavar="FILE.gguf", help="a llama, mistral, qwen2 or qwen3 GGUF (any tensor type "
                     "the gguf package dequantises; the weights become fp32)")
    gin.add_argument("out", metavar="OUT", help="the run directory to create (config.resolved.toml + checkpoints/)")
    gin.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    gin.add_argument("--json", action="store_true", help="print the result as JSON")
    gin.set_defaults(handler=run_from_gguf)

    gout = conv.add_parser("to-gguf", help="a meshlm checkpoint -> a GGUF file llama.cpp and ollama load")
    gout.add_argument("checkpoint", metavar="CHECKPOINT", help="a run directory (newest valid checkpoint) or a "
                      "step folder, written by any parallel layout (LoRA adapters are merged)")
    gout.add_argument("out", metavar="OUT.gguf", help="the GGUF file to write")
    gout.add_argument("--dtype", default="f32", choices=("f32", "f16", "bf16", "q8_0"),
                      help="type of the matrices (norms and other 1-D tensors stay f32)")
    gout.add_argument("--overwrite", action="store_true", help="replace OUT.gguf if it exists")
    gout.add_argument("--json", action="store_true", help="print the result as JSON")
    gout.set_defaults(handler=run_to_gguf)


def run_from_hf(args: argparse.Namespace) -> int:
    from meshlm.interop import convert_from_hf

    result = convert_from_hf(args.hf_dir, args.out, overwrite=args.overwrite)
    if args.json:
        emit(result, indent=1)
        return 0
    for note in result["notes"]:
        print(f"note: {note}")
    print(f"converted {result['architecture']} ({result['num_params']:,} parameters) -> {result['checkpoint']}")
    print(f"try: meshlm generate --checkpoint {args.out} --prompt \"Hello\" --greedy")
    return 0


def run_to_hf(args: argparse.Namespace) -> int:
    from meshlm.interop import convert_to_hf
    from meshlm.interop.hf_files import parse_size

    result = convert_to_hf(args.checkpoint, args.out_dir, max_shard_bytes=parse_size(args.max_shard_size),
                           overwrite=args.overwrite, dtype=args.dtype, adapter_only=args.adapter_only)
    if args.json:
        emit(result, indent=1)
        return 0
    print(f"wrote {result['architecture']} ({result['num_params']:,} parameters, "
          f"{len([f for f in result['weight_files'] if f.endswith('.safetensors')])} weight file(s)) "
          f"from {result['checkpoint']} -> {result['out']}")
    return 0


def run_from_gguf(args: argparse.Namespace) -> int:
    from meshlm.interop.gguf import convert_from_gguf

    result = convert_from_gguf(args.gguf_file, args.out, overwrite=args.overwrite)
    if args.json:
        emit(result, indent=1)
        return 0
    for note in result["notes"]:
        print(f"note: {note}")
    template = "with its chat template" if result["chat_template"] else "without a chat template"
    print(f"converted {result['architecture']} ({result['num_params']:,} parameters, {template}) -> "
          f"{result['checkpoint']}")
    print(f"try: meshlm generate --checkpoint {args.out} --prompt \"Hello\" --greedy")
    return 0


def run_to_gguf(args: argparse.Namespace) -> int:
    from meshlm.interop.gguf_export import convert_to_gguf

    result = convert_to_gguf(args.checkpoint, args.out, dtype=args.dtype, overwrite=args.overwrite)
    if args.json:
        emit(result, indent=1)
        return 0
    types = ", ".join(f"{n} {t}" for t, n in result["tensor_types"].items())
    print(f"wrote {result['architecture']} GGUF ({result['num_params']:,} parameters; tensors: {types}; "
          f"{result['bytes']:,} bytes) from {result['checkpoint']} -> {result['out']}")
    return 0
