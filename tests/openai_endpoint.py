"""A minimal, real OpenAI-compatible HTTP server for tests (stdlib ``http.server``, 127.0.0.1, port 0).

It answers ``POST /v1/chat/completions`` and ``POST /v1/completions`` from a function the test gives, so
clients are tested over a real socket, never through a mock of the client. ``GET /v1/models`` lists the one
model. Requests are recorded in ``server.requests`` (path, headers, body) for assertions.

    with OpenAIEndpointServer(lambda messages, body: "Sure.") as server:
        Endpoint(server.base_url, "toy").chat("hi")

The reply function gets the chat ``messages`` (for ``/completions``: ``[{"role": "user", "content": prompt}]``)
and the whole request body; it returns the reply text, or raises :class:`HTTPFailure` to answer with an
OpenAI error object and that status.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

ReplyFn = Callable[[list[dict[str, str]], dict[str, Any]], str]


class HTTPFailure(Exception):
    """Raised by a reply function to answer ``status`` with an OpenAI error object."""

    def __init__(self, status: int, message: str = "failure") -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class OpenAIEndpointServer:
    def __init__(self, reply: ReplyFn, model: str = "toy", api_key: str | None = None) -> None:
        self.reply = reply
        self.model = model
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "OpenAIEndpointServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "OpenAIEndpointServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- request handling ------------------------------------------------------------------------------
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet tests
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
                else:
                    self._error(404, f"no route {self.path}")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    return self._error(400, "body is not JSON")
                with server._lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    return self._error(401, "invalid api key")
                if body.get("model") != server.model:
                    return self._error(404, f"model {body.get('model')!r} does not exist")
                route = self.path.rstrip("/")
                if route == "/v1/chat/completions":
                    messages = body.get("messages")
                elif route == "/v1/completions":
                    messages = [{"role": "user", "content": body.get("prompt", "")}]
                else:
                    return self._error(404, f"no route {self.path}")
                try:
                    text = server.reply(messages, body)
                except HTTPFailure as exc:
                    return self._error(exc.status, exc.message)
                self._send(200, _completion(route, server.model, text))

            def _send(self, status: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str) -> None:
                self._send(status, {"error": {"message": message, "type": "invalid_request_error",
                                              "code": status}})

        return Handler


def _completion(route: str, model: str, text: str) -> dict[str, Any]:
    created = int(time.time())
    if route.endswith("chat/completions"):
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": "stop"}
        kind = "text_completion"
    return {"id": f"cmpl-{created}", "object": kind, "created": created, "model": model, "choices": [choice],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
