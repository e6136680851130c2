"""What the HTTP layer and the backends (a local batched engine, a remote OpenAI-compatible endpoint) exchange.

The server turns a validated request into a :class:`Job`; a backend's ``submit`` either refuses it at once with an
:class:`ApiError` (bad input, overload) or returns a :class:`Handle` whose ``events()`` yield text deltas and
end with one :class:`Finished` per choice (or a :class:`Failed`). The HTTP layer holds no model logic and the
backends know nothing about HTTP responses, so the gateway and the local engine share the routing, audit and
formatting code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from meshlm.generate.params import SamplingParams


class ApiError(Exception):
    """An OpenAI-style error: HTTP ``status`` and the ``{"error": {...}}`` body. Messages never quote user text
    (they may reach logs); ``retry_after`` (seconds) adds a Retry-After header (429/503)."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.retry_after = retry_after

    def to_json(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def overloaded(what: str, retry_after: int = 1) -> ApiError:
    return ApiError(429, f"{what} is at capacity; retry after {retry_after} s", type="rate_limit_error",
                    code="overloaded", retry_after=retry_after)


# A request's sampling fields: the one SamplingParams of generate() and rollout() (meshlm/generate/params.py).
# ``max_tokens`` None: as many as the context and the server cap allow; ``seed`` None draws a fresh one (choice
# i > 0 of a seeded request uses a seed derived from ``seed`` and i); ``stop`` strings end the text here.
Sampling = SamplingParams


@dataclass(frozen=True)
class Job:
    """One request for a backend. ``kind`` "chat" carries ``messages`` (role/content dicts with string content);
    "completion" carries ``prompt`` (text, or token ids). ``body`` is the validated request as the client sent
    it (the gateway forwards it); ``user_hash`` the salted hash of its ``user``."""

    kind: str
    request_id: str
    sampling: Sampling
    messages: list[dict[str, str]] | None = None
    prompt: str | list[int] | None = None
    body: dict[str, Any] = field(default_factory=dict)
    user_hash: str | None = None
    response_format: dict[str, Any] | None = None  # json_object / json_schema: decoded under a grammar
    tools: list[dict[str, Any]] | None = None  # chat: functions the template renders; calls parsed from the answer


@dataclass(frozen=True)
class TokenLogprob:
    """One generated (or echoed) token: its text, its UTF-8 bytes, its log-prob under the model (None for a
    prompt's first token) and the ``top`` most likely alternatives as (text, bytes, log-prob)."""

    token: str
    bytes: tuple[int, ...]
    logprob: float | None
    top: tuple[tuple[str, tuple[int, ...], float], ...] = ()


@dataclass(frozen=True)
class Delta:
    text: str
    index: int = 0  # the choice (0 .. n-1)
    logprobs: tuple[TokenLogprob, ...] = ()  # of the tokens whose text this delta completes
    tokens: int = 0  # generated tokens whose text this delta completes (0: an echoed prompt)


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop" (eos or a stop string) or "length"
    prompt_tokens: int
    completion_tokens: int
    index: int = 0


@dataclass(frozen=True)
class Failed:
    error: ApiError


Event = Delta | Finished | Failed


class Handle(Protocol):
    """A submitted job: its events in order (ending with Finished or Failed); ``cancel`` stops generation early
    (the client went away)."""

    def events(self) -> AsyncIterator[Event]: ...

    def cancel(self) -> None: ...


class Backend(Protocol):
    """A loaded version: a local model behind a batching engine, or a remote endpoint."""

    ref: str  # NAME:vN

    async def submit(self, job: Job) -> Handle: ...

    def status(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...
