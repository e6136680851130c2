"""``meshlm serve --registry DB --model NAME:vN``: the OpenAI-compatible server (docs/serving.md)."""

from __future__ import annotations

import argparse
import os

from meshlm.errors import ConfigError


def register(sub, add_config_args) -> None:
    p = sub.add_parser("serve", help="serve registry versions over an OpenAI-compatible HTTP API")
    p.add_argument("--registry", default=os.environ.get("MESHLM_REGISTRY", "meshlm-registry.sqlite"),
                   help="the registry file (`meshlm registry add`; default $MESHLM_REGISTRY or "
                        "./meshlm-registry.sqlite)")
    p.add_argument("--model", action="append", required=True, metavar="NAME:vN",
                   help="the stable version clients reach as model NAME (repeat for several names)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port; 0 picks a free one (see --port-file)")
    p.add_argument("--port-file", help="write {host, port, url, pid} as JSON here once the server accepts "
                                       "connections (for --port 0)")
    p.add_argument("--audit", help="the audit log (default: audit.sqlite beside the registry)")
    p.add_argument("--audit-key-file", help="a file holding the audit key: the log's chain is keyed (hmac-sha256; "
                                            "default $MESHLM_AUDIT_KEY_FILE or $MESHLM_AUDIT_KEY; docs/audit.md)")
    p.add_argument("--admin-token-file", help="a file holding the admin bearer token (without it the admin API "
                                              "refuses every call)")
    p.add_argument("--force", action="store_true", help="serve a version whose safety gates have not passed "
                                                        "(audited)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads of each model's decoding (default: torch's choice); 1 is fastest for small "
                        "models on a busy machine")
    p.add_argument("--weights", default="fp32", choices=("fp32", "int8", "int4"),
                   help="int8: decode steps on int8 copies of every local model's weights (CPU; faster, not the "
                        "same logits; docs/model.md, 'int8 decode weights'); int4: 4-bit copies (CPU, "
                        "faster still, further from fp32; 'Speed levers')")
    p.add_argument("--speculative", choices=("ngram",), default=None,
                   help="ngram: while one request decodes alone (greedy or sampled; no logit_bias, penalties, "
                        "response_format or logprobs), verify tokens drafted from its prompt and output (prompt "
                        "lookup) in one forward: the same tokens (sampled: with the same seed), faster where the "
                        "reply repeats its prompt; fp32 weights only (docs/serving.md, 'Speculative decoding')")
    p.add_argument("--max-batch", type=int, default=16, help="sequences decoded together per model (default 16)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests waiting per model before new ones get 429 (default 64)")
    p.add_argument("--max-tokens-cap", type=int, default=1024, help="the largest max_tokens a request may ask for")
    p.add_argument("--prefix-cache-mb", type=int, default=256,
                   help="MiB per local model for the keys and values of recent prompts: a prompt that starts like "
                        "one of them (a system prompt, the turns before) prefills only its new tokens (default "
                        "256; 0 turns it off; docs/serving.md, 'Prefix cache')")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM/SIGINT: seconds the requests in flight get to finish while new ones get 503 "
                        "(default 30)")
    p.set_defaults(handler=run)


def read_token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        token = open(path, encoding="utf-8").read().strip()
    except OSError as exc:
        raise ConfigError(f"--admin-token-file {path}: cannot read it ({exc.strerror})") from None
    if len(token) < 16:
        raise ConfigError(f"--admin-token-file {path}: the token must be at least 16 characters "
                          "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE`)")
    return token


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from meshlm.serve.launch import ServeOptions, serve

    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be at least 1, got {args.threads}")
    import torch

    # --threads are each model's engine thread's (meshlm/serve/engine.py); every other thread of the server runs
    # torch on one, so that no second multi-threaded OpenMP team slows the engine's (engine.py's _run says why)
    engine_threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(1)
    for name, value in (("--max-batch", args.max_batch), ("--max-queue", args.max_queue),
                        ("--max-tokens-cap", args.max_tokens_cap)):
        if value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}")
    from meshlm.generate.params import SamplingParams
    from meshlm.generate.speculative import check_speculative

    check_speculative(args.speculative, SamplingParams(temperature=0.0), args.weights)  # before any model loads
    if not 0 <= args.prefix_cache_mb <= 1 << 20:
        raise ConfigError(f"--prefix-cache-mb {args.prefix_cache_mb}: give 0 (off) to 1048576 MiB")
    if not 0 <= args.drain_timeout <= 3600:
        raise ConfigError(f"--drain-timeout {args.drain_timeout}: give 0..3600 seconds")
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port {args.port}: use 0..65535 (0 picks a free port)")
    audit = args.audit or str(Path(args.registry).resolve().parent / "audit.sqlite")
    from meshlm.serve.audit_keys import key_from_env, read_key_file

    audit_key = read_key_file(args.audit_key_file, "--audit-key-file") if args.audit_key_file else key_from_env()
    options = ServeOptions(registry=args.registry, models=args.model, host=args.host, port=args.port,
                           port_file=args.port_file, audit=audit, admin_token=read_token(args.admin_token_file),
                           force=args.force, device=args.device, max_batch=args.max_batch,
                           max_queue=args.max_queue, max_tokens_cap=args.max_tokens_cap, weights=args.weights,
                           drain_timeout=args.drain_timeout, audit_key=audit_key,
                           prefix_cache_mb=args.prefix_cache_mb, engine_threads=engine_threads,
                           speculative=args.speculative)
    serve(options)
    return 0
