"""The HTTP layer: OpenAI-compatible endpoints, the admin API, and one audit record per request.

No model logic lives here: a request is validated into a Job (schemas.py), routed to a backend (rollout.py) and
its events are formatted as OpenAI responses or server-sent events. Every completion request, including the ones
refused (bad input, unknown model, overload, client gone), appends exactly one ``kind: request`` record to the
audit log before its response ends; every admin call appends one ``kind: admin`` record. The audit log sanitizes
what it stores; the server's own log lines carry ids, versions, codes and counts only, and pass through the
sanitizer as well. Errors are OpenAI error objects, never tracebacks.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from meshlm.serve.admin import AdminApi, error_response
from meshlm.serve.memory import trim_heap
from meshlm.serve.metrics import Metrics
from meshlm.serve.operations import add_operations_routes
from meshlm.serve.protocol import ApiError, Delta, Failed, Finished, Handle, TokenLogprob
from meshlm.serve.rollout import Router
from meshlm.serve.sanitize import sanitize
from meshlm.serve.schemas import parse_body, to_job
from meshlm.serve.tools import parse_tool_calls

MAX_REFUSED_PROMPT_CHARS = 64 << 10  # a refused request's prompt longer than this is left out of its record


def log_line(message: str) -> None:
    """A server log line on stderr, sanitized like everything else that leaves the process."""
    print(sanitize(message), file=sys.stderr, flush=True)


@dataclass
class Exchange:
    """What one completion request did, for its audit record."""

    kind: str
    path: str
    request_id: str
    started: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)
    model: str | None = None
    version: str | None = None
    user_hash: str | None = None
    stream: bool = False
    prompt: Any = None
    n: int = 1
    logprobs: int | None = None  # None: the client asked for no log-probs
    tool_names: list[str] | None = None  # chat with tools: answers are searched for calls of these
    texts: dict[int, list[str]] = field(default_factory=dict)  # choice -> its text pieces
    tokens: dict[int, list[TokenLogprob]] = field(default_factory=dict)  # choice -> its tokens' log-probs
    ends: dict[int, Finished] = field(default_factory=dict)  # choice -> how it ended
    ttft: float | None = None
    status: int = 200
    error: str | None = None
    audited: bool = False
    # Streams: what the connection took (a chunk counts once its write returned), not what was generated.
    delivered: dict[int, int] = field(default_factory=dict)  # choice -> tokens
    shown: dict[int, list[str]] = field(default_factory=dict)  # choice -> text pieces
    client: str | None = None  # "disconnected" or "stopped_reading": the client did not take the whole answer
    failure: ApiError | None = None  # the backend's error event (its status and code reach the client)

    def deliver(self, index: int, tokens: int, text: str) -> None:
        if tokens:  # a gateway's deltas carry no counts: its early-ended streams record text, not a count
            self.delivered[index] = self.delivered.get(index, 0) + tokens
        self.shown.setdefault(index, []).append(text)

    def deliver_end(self, index: int) -> None:
        self.delivered[index] = self.ends[index].completion_tokens
        self.shown[index] = [self.text(index)]

    @property
    def finished(self) -> bool:
        return len(self.ends) == self.n

    def text(self, index: int) -> str:
        return "".join(self.texts.get(index, []))

    def usage(self) -> dict[str, int]:
        """The prompt counted once, the completions of all choices summed."""
        prompt = next(iter(self.ends.values())).prompt_tokens if self.ends else 0
        completion = sum(f.completion_tokens for f in self.ends.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def record(self) -> dict[str, Any]:
        fin = self.finished
        texts = [self.text(i) for i in range(self.n)]
        reasons = [self.ends[i].finish_reason if i in self.ends else None for i in range(self.n)]
        usage = self.usage() if fin else {}
        completion = usage.get("completion_tokens")
        response = (texts[0] if self.n == 1 else texts) if fin or self.texts else None
        if self.stream and self.client is not None:  # the client left or stopped reading: what it was given
            shown = ["".join(self.shown.get(i, [])) for i in range(self.n)]
            completion = sum(self.delivered.values()) if self.delivered else None
            response = shown[0] if self.n == 1 else shown
        return {"kind": "request", "time": self.started, "request_id": self.request_id, "version": self.version,
                "user_hash": self.user_hash, "endpoint": self.path, "model": self.model, "stream": self.stream,
                "prompt": self.prompt, "response": response,
                "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": completion, "client": self.client,
                "finish_reason": (reasons[0] if self.n == 1 else reasons) if fin else None,
                "latency_s": round(time.perf_counter() - self.t0, 6),
                "ttft_s": None if self.ttft is None else round(self.ttft, 6),
                "status": self.status, "error": self.error}

    def fail(self, error: ApiError) -> None:
        self.status, self.error = error.status, error.message

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


class Server:
    """The app's state: router, audit log, admin token, metrics. ``app`` is the FastAPI application.

    ``draining`` (set by :meth:`start_draining`, on SIGTERM) refuses new completion requests with 503 and turns
    readiness off while the requests in ``in_flight`` finish."""

    def __init__(self, router: Router, audit, admin_token: str | None, log: Callable[[str], None] = log_line):
        self.router, self.audit, self.log = router, audit, log
        self.admin = AdminApi(router, self.write, admin_token, getattr(audit, "head", None))
        self.draining = False
        self.in_flight: dict[str, Exchange] = {}  # request id -> exchange, from admission to its audit record
        self.metrics = Metrics(self._live_state)
        self.app = self._build()

    def start_draining(self) -> None:
        if not self.draining:
            self.draining = True
            self.log(f"draining: new requests get 503; {len(self.in_flight)} in flight")

    def cut_off(self) -> int:
        """The drain timed out: the requests still running will be audited as cut off by the shutdown."""
        for ex in self.in_flight.values():
            if ex.error is None:
                ex.fail(ApiError(503, "the server shut down before this request finished", type="server_error",
                                 code="shutting_down"))
        return len(self.in_flight)

    def _live_state(self) -> dict[str, Any]:
        return {**self.router.status(), "in_flight": len(self.in_flight), "draining": self.draining}

    async def write(self, record: dict[str, Any]) -> None:
        """Append an audit record from a worker thread; shielded so a cancelled request still gets its record."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.audit.append, record)

    # --- routes ----------------------------------------------------------------------------------------------
    def _build(self) -> FastAPI:
        app = FastAPI(title="meshlm", docs_url=None, redoc_url=None, openapi_url=None)

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
            return error_response(ApiError(exc.status_code, f"{request.method} {request.url.path}: "
                                                            f"{exc.detail}", code="not_found"))

        @app.exception_handler(Exception)
        async def internal_error(request: Request, exc: Exception) -> JSONResponse:
            self.log(f"internal error on {request.url.path}: {type(exc).__name__}")
            return error_response(ApiError(500, "internal server error", type="server_error"))

        add_operations_routes(app, self)

        @app.get("/v1/models")
        async def models(request: Request) -> dict[str, Any]:
            data = []
            for name, dep in self.router.deployments.items():
                data.append({"id": name, "object": "model", "created": 0, "owned_by": "meshlm",
                             "stable": dep.to_json()["stable_ref"], "candidate": dep.to_json()["candidate_ref"]})
            admin = self.admin.is_admin(request)
            for ref, backend in self.router.backends.items():  # an adapter names its base as its parent
                if not (admin or self.router.pinnable(ref)):
                    continue  # a candidate, or a stable kept for rollback: reached by name through the rollout
                base = getattr(backend, "base", None)
                data.append({"id": ref, "object": "model", "created": 0, "owned_by": "meshlm",
                             **({"parent": base.ref} if base is not None else {})})
            return {"object": "list", "data": data}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return await self.complete(request, "chat")

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            return await self.complete(request, "completion")

        self.admin.add_routes(app)
        return app

    # --- completions -----------------------------------------------------------------------------------------
    async def complete(self, request: Request, kind: str) -> Response:
        ex = Exchange(kind, request.url.path, ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex)
        try:
            body = parse_body(await request.body())
            ex.prompt = body.get("messages") if kind == "chat" else body.get("prompt")
            ex.model = body.get("model") if isinstance(body.get("model"), str) else None
            ex.stream = body.get("stream") is True
            job, req = to_job(kind, body, ex.request_id, self.router.user_hash)
            ex.prompt = job.messages if kind == "chat" else job.prompt
            ex.user_hash = job.user_hash
            ex.n, ex.logprobs = job.sampling.n, job.sampling.logprobs
            ex.tool_names = [t["function"]["name"] for t in job.tools] if job.tools else None
            if self.draining:
                raise ApiError(503, "the server is shutting down; retry (another replica)", type="server_error",
                               code="shutting_down", retry_after=1)
            backend = self.router.route(req.model, job.user_hash, ex.request_id, admin=self.admin.is_admin(request))
            ex.version = backend.ref
            self.in_flight[ex.request_id] = ex
            handle = await backend.submit(job)
        except ApiError as error:
            ex.fail(error)
            big = _text_chars(ex.prompt, MAX_REFUSED_PROMPT_CHARS) > MAX_REFUSED_PROMPT_CHARS
            if big:  # not worth sanitising: the record says only that it was large
                ex.prompt = None
                ex.error = f"{error.message} (its prompt, over {MAX_REFUSED_PROMPT_CHARS} characters, is not recorded)"
            await self._finish(ex)
            response = error_response(error)
            if big:  # once the body is freed (after the response), hand its pages back
                response.background = BackgroundTask(anyio.to_thread.run_sync, trim_heap)
            return response
        except Exception as exc:  # a bug: still one audit record, and an error object, not a traceback
            return await self._internal(ex, exc)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        if req.stream:
            return AuditedStream(self._sse(ex, handle, include_usage), self._closer(ex, handle),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Request-Id": ex.request_id})
        try:
            async for event in handle.events():
                self._note(ex, event)
        except Exception as exc:
            handle.cancel()
            return await self._internal(ex, exc)
        except BaseException:  # cancelled: the client went away (or the shutdown cut it off: cut_off)
            handle.cancel()
            if ex.error is None:
                ex.fail(ApiError(499, "the client closed the connection"))
                ex.client = "disconnected"
            await self._finish(ex)
            raise
        await self._finish(ex)
        if not ex.finished:
            return error_response(ex.failure or ApiError(ex.status, ex.error or "generation failed",
                                                         type="server_error"))
        return JSONResponse(self._body(ex, final=True))

    async def _internal(self, ex: Exchange, exc: Exception) -> Response:
        error = ApiError(500, "internal server error", type="server_error")
        self.log(f"{ex.request_id}: internal error ({type(exc).__name__})")
        ex.fail(error)
        await self._finish(ex)
        return error_response(error)

    def _note(self, ex: Exchange, event) -> None:
        if isinstance(event, Delta):
            if ex.ttft is None:
                ex.ttft = time.perf_counter() - ex.t0
            ex.texts.setdefault(event.index, []).append(event.text)
            ex.tokens.setdefault(event.index, []).extend(event.logprobs)
        elif isinstance(event, Finished):
            ex.ends[event.index] = event
        elif isinstance(event, Failed):
            ex.fail(event.error)
            ex.failure = event.error

    async def _sse(self, ex: Exchange, handle: Handle, include_usage: bool) -> AsyncIterator[bytes]:
        """Server-sent events: a role chunk (chat), one chunk per delta, a finish chunk, usage, [DONE]."""
        try:
            if ex.kind == "chat":
                for i in range(ex.n):
                    yield _event(self._chunk(ex, i, {"role": "assistant", "content": ""}))
            async for event in handle.events():
                self._note(ex, event)
                if isinstance(event, Delta) and ex.tool_names is None:
                    delta = {"content": event.text} if ex.kind == "chat" else event.text
                    yield _event(self._chunk(ex, event.index, delta, logprobs=event.logprobs))
                    ex.deliver(event.index, event.tokens, event.text)  # the connection took it
                elif isinstance(event, Finished):
                    reason = event.finish_reason
                    if ex.tool_names is not None:  # the answer is known only whole: a call, or text
                        message, reason = self._message(ex, event.index)
                        message.pop("role")
                        yield _event(self._chunk(ex, event.index, message, logprobs=tuple(ex.tokens.get(event.index,
                                                                                                      []))))
                    yield _event(self._chunk(ex, event.index, {} if ex.kind == "chat" else "", reason))
                    ex.deliver_end(event.index)
                elif isinstance(event, Failed):
                    if getattr(handle, "stalled", False):  # a local stream whose client stopped reading
                        ex.client = "stopped_reading"
                    yield _event(event.error.to_json())
            if include_usage and ex.finished:
                yield _event({**self._body(ex, final=False), "choices": [], "usage": ex.usage()})
            yield b"data: [DONE]\n\n"
        except Exception as exc:  # a bug: end the stream with an error object, keep the one record
            handle.cancel()
            self.log(f"{ex.request_id}: internal error ({type(exc).__name__})")
            ex.fail(ApiError(500, "internal server error", type="server_error"))
            yield _event(ApiError(500, "internal server error", type="server_error").to_json())
        except BaseException:  # the client went away (cancelled, or the generator closed)
            handle.cancel()
            if not ex.finished and ex.error is None:
                ex.fail(ApiError(499, "the client closed the connection"))
            if any(ex.delivered.get(i) != (ex.ends[i].completion_tokens if i in ex.ends else -1) for i in range(ex.n)):
                ex.client = "stopped_reading" if getattr(handle, "stalled", False) else "disconnected"
            raise
        finally:
            await self._finish(ex)

    def _closer(self, ex: Exchange, handle: Handle):
        """For AuditedStream: the record of a stream whose generator never ran (client gone before the start)."""
        async def close() -> None:
            if not ex.audited:
                handle.cancel()
                if not ex.finished and ex.error is None:
                    ex.fail(ApiError(499, "the client closed the connection"))
                ex.client = ex.client or "disconnected"
                await self._finish(ex)
        return close

    async def _finish(self, ex: Exchange) -> None:
        """Write the exchange's one audit record (idempotent) and its log line."""
        if ex.audited:
            return
        ex.audited = True
        self.in_flight.pop(ex.request_id, None)
        try:
            await self.write(ex.record())
        except Exception as exc:  # the log is unavailable: say so loudly; the response still reports its status
            self.log(f"{ex.request_id}: AUDIT WRITE FAILED ({type(exc).__name__})")
            raise
        finally:  # after the record: a metrics error never costs it
            try:
                self.metrics.observe(ex)
            except Exception as exc:
                self.log(f"{ex.request_id}: metrics not updated ({type(exc).__name__})")
        usage = ex.usage() if ex.finished else None
        tokens = f"{usage['prompt_tokens']}+{usage['completion_tokens']} tokens" if usage else "-"
        self.log(f"{ex.request_id} {ex.version or '-'} {ex.status} {tokens} "
                 f"{time.perf_counter() - ex.t0:.3f}s{' stream' if ex.stream else ''}")

    # --- response bodies -------------------------------------------------------------------------------------
    def _body(self, ex: Exchange, final: bool) -> dict[str, Any]:
        chat = ex.kind == "chat"
        body = {"id": ex.request_id, "object": "chat.completion" if chat else "text_completion",
                "created": int(ex.started), "model": ex.model, "system_fingerprint": ex.version}
        if final:
            choices = []
            for i in range(ex.n):
                choice = {"index": i, "finish_reason": ex.ends[i].finish_reason,
                          "logprobs": self._logprobs(ex, ex.tokens.get(i, []))}
                if chat:
                    choice["message"], choice["finish_reason"] = self._message(ex, i)
                else:
                    choice["text"] = ex.text(i)
                choices.append(choice)
            body.update(choices=choices, usage=ex.usage())
        elif chat:
            body["object"] = "chat.completion.chunk"
        return body

    @staticmethod
    def _message(ex: Exchange, index: int) -> tuple[dict[str, Any], str]:
        """Choice ``index`` as an assistant message, with its tool calls parsed out; and its finish_reason."""
        text, reason = ex.text(index), ex.ends[index].finish_reason
        if ex.tool_names is None:
            return {"role": "assistant", "content": text}, reason
        content, calls = parse_tool_calls(text, ex.tool_names)
        if not calls:
            return {"role": "assistant", "content": text}, reason
        return {"role": "assistant", "content": content,
                "tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}, "tool_calls"

    def _chunk(self, ex: Exchange, index: int, delta: dict | str, finish_reason: str | None = None,
               logprobs: tuple[TokenLogprob, ...] = ()) -> dict[str, Any]:
        body = self._body(ex, final=False)
        choice = {"index": index, "finish_reason": finish_reason,
                  "logprobs": self._logprobs(ex, logprobs) if logprobs else None}
        choice.update({"delta": delta} if ex.kind == "chat" else {"text": delta})
        body["choices"] = [choice]
        return body

    @staticmethod
    def _logprobs(ex: Exchange, tokens: list[TokenLogprob] | tuple[TokenLogprob, ...]) -> dict[str, Any] | None:
        """Chat: ``{"content": [{token, logprob, bytes, top_logprobs}]}``; completions: the legacy
        ``{tokens, token_logprobs, top_logprobs, text_offset}``."""
        if ex.logprobs is None:
            return None
        if ex.kind == "chat":
            return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes),
                                 "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(b)} for s, b, lp in t.top]}
                                for t in tokens], "refusal": None}
        offsets, pos = [], 0
        for t in tokens:
            offsets.append(pos)
            pos += len(t.token)
        return {"tokens": [t.token for t in tokens], "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [{s: lp for s, _, lp in t.top} if t.logprob is not None else None for t in tokens],
                "text_offset": offsets}


class AuditedStream(StreamingResponse):
    """A streaming response that runs ``on_close`` however the response ends: Starlette may never start the body
    iterator (the client left first), and then the iterator's own clean-up, which writes the audit record, never
    runs."""

    def __init__(self, content, on_close: Callable[[], Awaitable[None]], **kwargs) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()


def _text_chars(value: Any, limit: int) -> int:
    """Characters of the strings inside ``value`` (messages, a prompt), counted until past ``limit``."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"

