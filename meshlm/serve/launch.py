"""Starting a server: check and load the versions, bind the socket, say where it listens, run uvicorn.

The socket is bound (and listening) before the port file is written, and the models are loaded before that, so
a client that reads the port file can connect at once: connections wait in the listen backlog until uvicorn
accepts them. uvicorn's access log is off (it would write client addresses, personal data, to the log); the
server writes its own sanitized lines instead.

SIGINT/SIGTERM drain the server: it keeps accepting connections but answers new completion requests 503 (and
``/health/ready`` 503), lets the requests in flight finish for up to ``drain_timeout`` seconds, then stops; a
request still running then is cut off and audited with status 503. A second signal cuts them off at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from meshlm.errors import ConfigError, UserError
from meshlm.fileio import atomic_write_text
from meshlm.serve.audit import AuditLog
from meshlm.serve.protocol import ApiError
from meshlm.serve.registry import Registry
from meshlm.serve.rollout import Router


@dataclass
class ServeOptions:
    registry: str
    models: list[str]
    audit: str
    host: str = "127.0.0.1"
    port: int = 8000
    port_file: str | None = None
    admin_token: str | None = None
    force: bool = False
    device: str | None = None
    max_batch: int = 16
    max_queue: int = 64
    max_tokens_cap: int = 1024
    weights: str = "fp32"  # the decode path's weight format (meshlm/generate/int8.py)
    drain_timeout: float = 30.0  # seconds in-flight requests get to finish after SIGTERM
    audit_key: bytes | None = None  # keys the audit chain (hmac-sha256; meshlm/serve/audit_keys.py)
    prefix_cache_mb: int = 256  # per local model: recent prompts' keys and values (meshlm/serve/prefix.py); 0: off
    engine_threads: int | None = None  # torch threads of each model's engine thread (None: torch's default)
    speculative: str | None = None  # "ngram": a lone request verifies prompt-lookup drafts (engine.py _draft)


def make_loader(opts: ServeOptions, registry=None):
    """entry -> Backend: a remote endpoint, a checkpoint loaded (verified) in a worker thread, or an adapter on its
    base (the base loaded once, shared by the base's own version and all its adapters)."""
    import anyio
    import torch

    from meshlm.serve.gateway import RemoteBackend
    from meshlm.serve.local import AdapterBackend, LocalBackend

    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    bases: dict[str, LocalBackend] = {}

    def load_local(entry) -> LocalBackend:  # in a worker thread: loading and packing on one torch thread, so that
        threads = opts.engine_threads or torch.get_num_threads()  # (read first: unset, the engine gets the default)
        torch.set_num_threads(1)  # only the engine thread keeps a multi-threaded OpenMP team (engine.py's _run)
        return LocalBackend.load(entry, device=device, max_tokens_cap=opts.max_tokens_cap, max_batch=opts.max_batch,
                                 max_queue=opts.max_queue, weights=opts.weights,
                                 prefix_cache_bytes=opts.prefix_cache_mb << 20, threads=threads,
                                 speculative=opts.speculative)

    async def local(entry) -> LocalBackend:
        backend = await anyio.to_thread.run_sync(load_local, entry)
        bases[entry.ref] = backend
        # Its decode packs were made while loading (meshlm/serve/engine.py): say what they hold (GET /admin/status:
        # loaded.<version>.pack_bytes).
        print(f"meshlm serve: loaded {entry.ref} on {device}, {opts.weights} decode packs made at load: "
              f"{backend.engine.pack_bytes / 2**20:.1f} MiB beyond the weights; prefix cache up to "
              f"{opts.prefix_cache_mb} MiB", file=sys.stderr, flush=True)
        return backend

    async def load(entry):
        if entry.kind == "adapter":
            base = bases.get(entry.adapter["of"])
            if base is None or base.closed:
                base = await local(registry.get(entry.adapter["of"]))
                base.holders -= 1  # held by its adapters only (not served as its own version)
            try:
                return await anyio.to_thread.run_sync(AdapterBackend.load, entry, base)
            except BaseException:
                if base.closed:  # loaded for this adapter alone: stop its engine again
                    await base.aclose()
                raise
        if entry.kind == "endpoint":
            remote = RemoteBackend(entry, max_tokens_cap=opts.max_tokens_cap, max_inflight=opts.max_queue)
            try:
                await remote.check()
            except BaseException:
                await remote.aclose()
                raise
            return remote
        base = bases.get(entry.ref)
        if base is not None and not base.closed:  # already loaded for its adapters: share it
            base.holders += 1
            return base
        return await local(entry)
    return load


SEND_BUFFER_BYTES = 256 << 10  # per connection (the kernel doubles it for its bookkeeping)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Connections inherit it (Linux): a client that stops reading holds at most this much in the kernel (not the
    # 4 MB autotuning reaches), so its stream backs up into the server's bounded buffer and is cut there.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port (0: any free one)")
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(opts: ServeOptions) -> None:
    asyncio.run(_serve(opts))


def draining_server(config, app_server, drain_timeout: float, log):
    """A uvicorn.Server whose first SIGINT/SIGTERM starts a drain (``app_server.start_draining``) instead of an
    immediate stop; it stops when nothing is in flight or ``drain_timeout`` has passed (checked on uvicorn's
    0.1 s tick). A second signal cuts off the requests still in flight at the next tick (they are audited)."""
    import time

    import uvicorn

    class Draining(uvicorn.Server):
        deadline: float | None = None

        def handle_exit(self, sig, frame) -> None:
            if self.should_exit:  # already stopping: uvicorn's own handling (a SIGINT forces the exit)
                return super().handle_exit(sig, frame)
            if self.deadline is not None:  # the second signal: cut off what is in flight at the next tick
                self.deadline = 0.0
                return
            self.deadline = time.monotonic() + drain_timeout
            app_server.start_draining()

        async def on_tick(self, counter: int) -> bool:
            if self.deadline is not None and not self.should_exit:
                if not app_server.in_flight:
                    self.should_exit = True
                elif time.monotonic() > self.deadline:
                    why = "a second signal" if self.deadline == 0.0 else f"drain timeout ({drain_timeout:g} s)"
                    log(f"{why}: cutting off {app_server.cut_off()} requests")
                    self.config.timeout_graceful_shutdown = 1  # uvicorn cancels them after this
                    self.should_exit = True
            return await super().on_tick(counter)

    return Draining(config)


async def _serve(opts: ServeOptions) -> None:
    import time

    import uvicorn

    from meshlm.serve.server import Server

    registry = Registry(opts.registry, create=False)
    entries = [registry.get(ref) for ref in opts.models]
    if len({e.name for e in entries}) != len(entries):
        raise ConfigError("--model: give each name once (its stable version); roll out others with `meshlm rollout`")
    blocked = [e for e in entries if not e.servable]
    if blocked and not opts.force:
        raise ConfigError(", ".join(f"{e.ref} (gates: {e.gate_status})" for e in blocked) +
                          ": no passing safety report; register one with --report, or pass --force (audited)")
    audit = AuditLog(opts.audit, key=opts.audit_key)
    router = Router(registry, make_loader(opts, registry), registry.secret("user_hash_key"))
    try:
        for entry in entries:
            try:
                await router.serve(entry.ref)
            except ApiError as exc:
                raise UserError(exc.message) from None
            audit.append({"kind": "admin", "time": time.time(), "action": "serve", "name": entry.name,
                          "version": entry.ref, "status": 200, "forced": not entry.servable,
                          "gate_status": entry.gate_status, "pid": os.getpid()})
        server = Server(router, audit, opts.admin_token)
        sock = bind(opts.host, opts.port)
        host, port = sock.getsockname()[:2]
        url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        config = uvicorn.Config(server.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=30)
        if opts.port_file:  # url: the server's root (/health, /metrics, /admin); base_url: an OpenAI client's
            atomic_write_text(Path(opts.port_file), json.dumps({"host": host, "port": port, "url": url,
                                                                 "base_url": url + "/v1", "pid": os.getpid()}))
        # The operator's own settings, no request data: printed as they are (the sanitizer would mask the address).
        print(f"meshlm serve: {', '.join(e.ref for e in entries)} on {url} (OpenAI base URL {url}/v1; audit "
              f"{opts.audit}, admin API {'on' if opts.admin_token else 'off'}, metrics "
              f"{'on' if server.metrics.available else 'off'})", file=sys.stderr, flush=True)
        # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler it found;
        # a no-op one lets the cleanup below run and the process exit 0.
        previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            await draining_server(config, server, opts.drain_timeout, server.log).serve(sockets=[sock])
            # uvicorn cancels requests cut off by the drain timeout and returns without waiting for them: let
            # their shielded audit writes finish before the log closes.
            others = asyncio.all_tasks() - {asyncio.current_task()}
            if others:
                await asyncio.wait(others, timeout=10)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        await router.aclose()
        audit.close()
        registry.close()
