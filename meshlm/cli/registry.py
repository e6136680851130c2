"""``meshlm registry add|list|show``: named, numbered model versions with their hashes and safety gates."""

from __future__ import annotations

import argparse
import os

from meshlm.cli.jsonout import emit
from meshlm.errors import ConfigError

_DEFAULT = os.environ.get("MESHLM_REGISTRY", "meshlm-registry.sqlite")


def register(sub, add_config_args) -> None:
    p = sub.add_parser("registry", help="register checkpoints or remote endpoints as NAME:vN versions")
    rsub = p.add_subparsers(dest="registry_command", required=True, metavar="{add,list,show}")
    add = rsub.add_parser("add", help="record a checkpoint (or --endpoint URL) as the next version of NAME")
    add.add_argument("checkpoint", nargs="?", help="a run directory (newest valid checkpoint) or a step folder")
    add.add_argument("--endpoint", metavar="URL", help="instead of a checkpoint: the base URL of an "
                                                       "OpenAI-compatible server (…/v1), e.g. a vLLM server")
    add.add_argument("--remote-model", help="with --endpoint: the model name to ask it for (default NAME)")
    add.add_argument("--adapter-of", metavar="NAME:vN", help="the checkpoint is a LoRA adapter of this registered "
                     "version: served on that base, batched with its other adapters")
    add.add_argument("--name", required=True)
    add.add_argument("--report", metavar="EVAL_DIR/report.json",
                     help="the `meshlm eval safety` report; without one (or with failed gates) serving or rolling "
                          "the version out needs --force")
    for q in (add,):
        q.add_argument("--registry", default=_DEFAULT, help="registry file (default $MESHLM_REGISTRY or "
                                                            "./meshlm-registry.sqlite)")
        q.add_argument("--json", action="store_true")
    add.set_defaults(handler=run_add)
    ls = rsub.add_parser("list", help="every version, one line each")
    ls.add_argument("name", nargs="?", help="only this name")
    show = rsub.add_parser("show", help="everything recorded about NAME:vN (or every version of NAME)")
    show.add_argument("ref", metavar="NAME[:vN]")
    for q in (ls, show):
        q.add_argument("--registry", default=_DEFAULT)
        q.add_argument("--json", action="store_true")
    ls.set_defaults(handler=run_list)
    show.set_defaults(handler=run_show)


def run_add(args: argparse.Namespace) -> int:
    from meshlm.serve.registry import Registry

    if bool(args.checkpoint) == bool(args.endpoint):
        raise ConfigError("registry add: give a CHECKPOINT or --endpoint URL (exactly one)")
    if args.remote_model and not args.endpoint:
        raise ConfigError("--remote-model goes with --endpoint")
    if args.adapter_of and args.endpoint:
        raise ConfigError("--adapter-of goes with a CHECKPOINT (a LoRA run), not --endpoint")
    registry = Registry(args.registry)
    if args.endpoint:
        entry = registry.add_endpoint(args.endpoint, args.name, args.remote_model, args.report)
    elif args.adapter_of:
        entry = registry.add_adapter(args.checkpoint, args.name, args.adapter_of, args.report)
    else:
        entry = registry.add_checkpoint(args.checkpoint, args.name, args.report)
    if args.json:
        emit(entry.to_json())
    else:
        note = "" if entry.servable else "  (not servable without --force: " + entry.gate_status + ")"
        print(f"registered {entry.ref}: {entry.kind} {entry.source}{note}")
        if entry.weights_sha256:
            print(f"weights_sha256 {entry.weights_sha256}")
        if entry.adapter:
            print(f"adapter of {entry.adapter['of']} (base {entry.adapter['base_weights_sha256'][:12]}, adapter "
                  f"{entry.adapter['adapter_sha256'][:12]})")
        force = "" if entry.servable else " --force"  # audited; a passing --report makes it servable without
        print(f"serve it: meshlm serve --registry {args.registry} --model {entry.ref}{force}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from meshlm.serve.registry import Registry

    entries = Registry(args.registry, create=False).versions(args.name)
    if args.json:
        emit([_summary(e) for e in entries])
        return 0
    for e in entries:
        sha = (e.weights_sha256 or "-")[:12]
        print(f"{e.ref:<24} {e.kind:<10} gates {e.gate_status:<9} {sha:<12} {e.created_at} {e.created_by}  "
              f"{e.source}")
    if not entries:
        print("no versions registered")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from meshlm.serve.registry import Registry, RegistryError

    registry = Registry(args.registry, create=False)
    if ":" in args.ref:
        docs = [registry.get(args.ref).to_json()]
    else:
        docs = [e.to_json() for e in registry.versions(args.ref)]
        if not docs:
            raise RegistryError(f"no versions of '{args.ref}' in {args.registry}")
    if args.json:
        emit(docs[0] if ":" in args.ref else docs, indent=1)
        return 0
    for doc in docs:
        for key in ("ref", "kind", "source", "remote_model", "weights_sha256", "checkpoint_sha256", "gate_status",
                    "created_by", "created_at"):
            if doc.get(key) is not None:
                print(f"{key:<18} {doc[key]}")
        if doc.get("report"):
            print(f"{'report':<18} {doc['report']['path']} (sha256 {doc['report']['sha256'][:12]})")
        if doc.get("config"):
            model = doc["config"].get("model", {})
            print(f"{'model':<18} {model.get('flavor')} dim {model.get('dim')} layers {model.get('n_layers')} "
                  f"context {model.get('max_seq_len')}")
        print()
    return 0


def _summary(e) -> dict:
    keep = ("ref", "name", "version", "kind", "source", "remote_model", "weights_sha256", "gate_status", "servable",
            "created_by", "created_at", "adapter")
    doc = e.to_json()
    return {k: doc[k] for k in keep}
