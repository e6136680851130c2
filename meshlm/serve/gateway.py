"""A registered endpoint as a backend: the request goes to a remote OpenAI-compatible server (vLLM, another
meshlm server), always streamed, and comes back as the same events a local engine produces.

So routing, rollout, sanitized audit records and response formatting are the same code for both, and the client
sees this server's ids, model name and ``system_fingerprint`` (the registry version). The remote is asked for the
version's ``remote_model``; the client's ``user`` is replaced by its salted hash (the raw id never leaves this
server). Upstream 4xx errors keep their status and message; 429/503 keep Retry-After; anything else becomes 502.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2

from meshlm.errors import UserError
from meshlm.serve.protocol import ApiError, Delta, Event, Failed, Finished, Job, overloaded
from meshlm.serve.registry import ModelVersion

_DROP = ("model", "stream", "stream_options", "user")
_closing: set[asyncio.Task] = set()  # connection closes in progress (a task needs a reference to finish)


def _count(value: Any, default: int) -> int:
    """A token count the remote reported, as an int >= 0 (a remote's odd value never reaches the metrics)."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return default


class RemoteHandle:
    def __init__(self, response: httpx2.Response, kind: str) -> None:
        self._response, self._kind = response, kind
        self.closed = False

    async def events(self) -> AsyncIterator[Event]:
        reason, usage, chunks = None, None, 0
        try:
            async for line in self._response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    yield Failed(_upstream_error(502, chunk))
                    return
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") if self._kind == "chat" else choice.get("text")
                    if text:
                        chunks += 1
                        yield Delta(text)
                    reason = choice.get("finish_reason") or reason
        except (httpx2.HTTPError, ValueError) as exc:
            yield Failed(ApiError(502, f"the upstream stream broke off ({type(exc).__name__})", type="server_error",
                                  code="upstream_error"))
            return
        finally:
            await self.aclose()
        usage = usage if isinstance(usage, dict) else {}
        yield Finished(reason or "stop", _count(usage.get("prompt_tokens"), 0),
                       _count(usage.get("completion_tokens") or chunks, chunks))

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            await self._response.aclose()

    def cancel(self) -> None:
        """Close the upstream connection (the remote sees the client leave and stops generating)."""
        if not self.closed:
            self.closed = True
            task = asyncio.get_running_loop().create_task(self._response.aclose())
            _closing.add(task)
            task.add_done_callback(_closing.discard)


class RemoteBackend:
    """A version served elsewhere; at most ``max_inflight`` requests at once go to it."""

    def __init__(self, entry: ModelVersion, *, max_tokens_cap: int = 1024, max_inflight: int = 64,
                 timeout: float = 600.0) -> None:
        self.ref, self.url, self.remote_model = entry.ref, entry.source, entry.remote_model or entry.name
        self.max_tokens_cap, self.max_inflight = max_tokens_cap, max_inflight
        self._client = httpx2.AsyncClient(timeout=httpx2.Timeout(timeout, connect=10.0))
        self._inflight = 0
        self._requests = 0

    async def submit(self, job: Job) -> RemoteHandle:
        max_tokens = job.sampling.max_tokens
        if max_tokens is not None and max_tokens > self.max_tokens_cap:
            raise ApiError(400, f"max_tokens {max_tokens} is above this server's cap of {self.max_tokens_cap}",
                           param="max_tokens", code="max_tokens_above_cap")
        for field_, asked in (("n", job.sampling.n > 1), ("logprobs", job.sampling.logprobs is not None),
                              ("tools", job.tools is not None)):
            if asked:  # this relay reads one choice's text; the upstream may not compute these the same way
                raise ApiError(400, f"{field_} is not relayed to an endpoint version ({self.ref}); ask the endpoint "
                                    "directly", param=field_, code="unsupported_parameter")
        if self._inflight >= self.max_inflight:
            raise overloaded(f"upstream {self.ref}")
        body = {k: v for k, v in job.body.items() if k not in _DROP}
        body.update(model=self.remote_model, stream=True, stream_options={"include_usage": True})
        if job.user_hash is not None:
            body["user"] = job.user_hash
        path = "/chat/completions" if job.kind == "chat" else "/completions"
        self._inflight += 1
        self._requests += 1
        try:
            response = await self._client.send(self._client.build_request("POST", self.url + path, json=body),
                                               stream=True)
        except httpx2.HTTPError as exc:
            self._inflight -= 1
            raise ApiError(502, f"upstream {self.ref} is unreachable ({type(exc).__name__})", type="server_error",
                           code="upstream_error") from None
        if response.status_code != 200:
            self._inflight -= 1
            raw = await response.aread()
            await response.aclose()
            raise _upstream_error(response.status_code, _json(raw), response.headers.get("retry-after"))
        return _Counted(RemoteHandle(response, job.kind), self)

    async def check(self) -> None:
        """Refuse (UserError) an endpoint that does not answer ``GET /models`` or does not list the model."""
        try:
            response = await self._client.get(self.url + "/models", timeout=10.0)
            ids = [m.get("id") for m in response.json().get("data", [])] if response.status_code == 200 else None
        except (httpx2.HTTPError, ValueError, AttributeError) as exc:
            raise UserError(f"{self.ref}: {self.url}/models did not answer ({type(exc).__name__})") from None
        if ids is None:
            raise UserError(f"{self.ref}: {self.url}/models answered HTTP {response.status_code}")
        if self.remote_model not in ids:
            raise UserError(f"{self.ref}: {self.url} does not serve '{self.remote_model}' (it lists "
                            f"{', '.join(map(str, ids[:10])) or 'nothing'}); register it with --remote-model")

    def status(self) -> dict[str, Any]:
        return {"kind": "endpoint", "url": self.url, "remote_model": self.remote_model, "active": self._inflight,
                "requests": self._requests, "max_inflight": self.max_inflight}

    async def aclose(self) -> None:
        await self._client.aclose()


class _Counted:
    """A handle that gives its in-flight slot back when its events end (or it is dropped)."""

    def __init__(self, inner: RemoteHandle, backend: RemoteBackend) -> None:
        self._inner, self._backend, self._released = inner, backend, False

    async def events(self) -> AsyncIterator[Event]:
        try:
            async for event in self._inner.events():
                yield event
        finally:
            self._release()

    def cancel(self) -> None:
        self._inner.cancel()
        self._release()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._backend._inflight -= 1


def _json(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _upstream_error(status: int, body: dict[str, Any], retry_after: str | None = None) -> ApiError:
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    message = str(error.get("message") or f"upstream answered HTTP {status}")
    if status in (429, 503) or 400 <= status < 500:
        wait = int(retry_after) if retry_after and retry_after.isdigit() else (1 if status in (429, 503) else None)
        return ApiError(status, message, type=str(error.get("type") or "invalid_request_error"),
                        param=error.get("param"), code=error.get("code"), retry_after=wait)
    return ApiError(502, f"upstream error: {message}", type="server_error", code="upstream_error")
