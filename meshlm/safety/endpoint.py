"""A small client for OpenAI-compatible ``/v1/chat/completions`` and ``/v1/completions`` endpoints.

Used wherever meshlm talks to a model behind HTTP: ``eval safety --endpoint``, the LLM judge, the
constitutional critique/revision loop and the model-driven red-team attacker. Plain stdlib ``urllib`` so that
it adds no dependency; requests are independent, so :meth:`Endpoint.chat_many` runs a few at a time in threads.

Errors: an endpoint that cannot be reached (after the retries), answers with an HTTP error, or returns a body
that is not an OpenAI response raises :class:`EndpointError` (a ``UserError``: exit 2 through the CLI) whose
message names the URL and what to check. The API key is read from the environment variable ``api_key_env``
(``OPENAI_API_KEY`` by default) and is never printed.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

from meshlm.errors import UserError

Message = dict[str, str]
_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class EndpointError(UserError):
    """The endpoint could not be reached or gave no usable answer."""


def normalize_base_url(base_url: str) -> str:
    """``http://host:8000`` and ``http://host:8000/`` mean ``http://host:8000/v1``; any other path is kept.

    OpenAI clients take the base URL including ``/v1``; people often leave it off. A non-empty path
    (``/v1``, ``/openai/v1``, a proxy prefix) is used as given.
    """
    parsed = urllib.parse.urlsplit(base_url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise EndpointError(f"endpoint URL {base_url!r} is not an http(s) URL; give e.g. http://127.0.0.1:8000/v1")
    path = parsed.path.rstrip("/")
    if not path:
        path = "/v1"
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, "", ""))


@dataclass
class Endpoint:
    """One model behind an OpenAI-compatible server.

    ``retries`` extra attempts are made on connection errors, timeouts and HTTP 408/429/5xx, waiting
    ``backoff_s · 2^attempt`` between them; other HTTP errors (400, 401, 404: a wrong model name or key) fail
    at once, with the server's error message.
    """

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    retries: int = 2
    backoff_s: float = 0.5
    concurrency: int = 4
    extra_headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.base_url = normalize_base_url(self.base_url)
        if not self.model:
            raise EndpointError(f"endpoint {self.base_url}: no model name; pass --model NAME")
        if self.retries < 0 or self.timeout_s <= 0 or self.concurrency < 1:
            raise EndpointError("endpoint: retries must be >= 0, timeout_s > 0 and concurrency >= 1")

    # ---- requests -------------------------------------------------------------------------------------
    def chat(self, messages: Sequence[Message] | str, *, max_tokens: int = 256, temperature: float = 0.0,
             system: str | None = None, **extra: Any) -> str:
        """The assistant's reply to one conversation (a plain string is one user message)."""
        msgs = _as_messages(messages, system)
        body = {"model": self.model, "messages": msgs, "max_tokens": max_tokens, "temperature": temperature,
                **extra}
        reply = self._post("/chat/completions", body)
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"endpoint {self.base_url}/chat/completions: the answer has no "
                                f"choices[0].message.content (got {_short(reply)})") from None
        return content or ""  # a null content (tool call, refusal field) is an empty reply

    def complete(self, prompt: str, *, max_tokens: int = 256, temperature: float = 0.0, **extra: Any) -> str:
        """Plain text completion through ``/completions`` (for base models without a chat template)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                **extra}
        reply = self._post("/completions", body)
        try:
            return reply["choices"][0]["text"] or ""
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"endpoint {self.base_url}/completions: the answer has no choices[0].text "
                                f"(got {_short(reply)})") from None

    def chat_many(self, conversations: Sequence[Sequence[Message] | str], *, max_tokens: int = 256,
                  temperature: float = 0.0, system: str | None = None, **extra: Any) -> list[str]:
        """Replies to many conversations, in order, ``concurrency`` requests at a time."""
        def one(conv: Sequence[Message] | str) -> str:
            return self.chat(conv, max_tokens=max_tokens, temperature=temperature, system=system, **extra)

        if self.concurrency == 1 or len(conversations) <= 1:
            return [one(c) for c in conversations]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations))) as pool:
            return list(pool.map(one, conversations))

    def generate_fn(self, *, max_tokens: int = 256, temperature: float = 0.0, system: str | None = None):
        """A ``generate(prompts) -> responses`` callable, the form :func:`meshlm.safety.evaluate` takes."""
        def generate(prompts: list[str]) -> list[str]:
            return self.chat_many(prompts, max_tokens=max_tokens, temperature=temperature, system=system)

        return generate

    # ---- transport ------------------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json", **self.extra_headers}
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + route
        data = json.dumps(body).encode("utf-8")
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(url, data=data, headers=self._headers(), method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    raw = response.read()
            except urllib.error.HTTPError as exc:
                detail = _error_detail(exc)
                if exc.code not in _RETRY_STATUS:
                    raise EndpointError(f"endpoint {url}: HTTP {exc.code}: {detail}"
                                        f"{_hint(exc.code, self)}") from None
                last = f"HTTP {exc.code}: {detail}"
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                last = f"{type(reason).__name__}: {reason}"
                continue
            try:
                reply = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise EndpointError(f"endpoint {url}: the answer is not JSON ({_short(raw)})") from None
            if not isinstance(reply, dict):
                raise EndpointError(f"endpoint {url}: the answer is not a JSON object ({_short(reply)})")
            return reply
        raise EndpointError(f"endpoint {url}: no answer after {self.retries + 1} attempt(s) ({last}); check "
                            "that the server is running and the URL is right")


def _as_messages(messages: Sequence[Message] | str, system: str | None) -> list[Message]:
    msgs = [{"role": "user", "content": messages}] if isinstance(messages, str) else [dict(m) for m in messages]
    if system and not (msgs and msgs[0].get("role") == "system"):
        msgs.insert(0, {"role": "system", "content": system})
    return msgs


def _error_detail(exc: urllib.error.HTTPError) -> str:
    """The message of an OpenAI error object ``{"error": {"message": ...}}``, else the start of the body."""
    try:
        raw = exc.read()
    except OSError:
        return str(exc.reason)
    try:
        body = json.loads(raw)
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    except (UnicodeDecodeError, json.JSONDecodeError):
        pass
    return _short(raw) or str(exc.reason)


def _hint(code: int, endpoint: Endpoint) -> str:
    if code == 401:
        return f"; set the API key in ${endpoint.api_key_env}"
    if code == 404:
        return f"; check the URL (base {endpoint.base_url}) and the model name {endpoint.model!r}"
    return ""


def _short(value: Any, limit: int = 200) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text if len(text) <= limit else text[:limit] + "..."
