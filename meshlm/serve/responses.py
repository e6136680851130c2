"""``POST /v1/responses``: OpenAI's Responses API over the chat completions path.

A Responses request is translated into a chat completions body (``instructions`` -> a system message, ``input``
-> messages, ``max_output_tokens`` -> ``max_tokens``, ``text.format`` -> ``response_format``) and handed to the
same code that serves ``/v1/chat/completions``: the same validation, routing and rollout, engine, structured
output grammar, audit record (endpoint ``/v1/responses``) and metrics. Its answer is translated back: a
``response`` object, or, streamed, the Responses event sequence (``response.created`` …
``response.output_text.delta`` … ``response.completed``). Text in and text out only: tools, images, files,
reasoning and stored conversations (``previous_response_id``, ``conversation``) are refused with a 400 naming
the parameter; nothing is stored, whatever ``store`` says.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from meshlm.serve.admin import error_response
from meshlm.serve.protocol import ApiError
from meshlm.serve.schemas import parse_body

if TYPE_CHECKING:
    from meshlm.serve.server import Server

# Accepted and ignored: they change nothing a stateless text server does.
_IGNORED = {"store", "metadata", "truncation", "parallel_tool_calls", "service_tier", "prompt_cache_key",
            "include", "stream_options"}
_REFUSED = {"tools", "tool_choice", "previous_response_id", "conversation", "reasoning", "background", "prompt",
            "max_tool_calls", "top_logprobs"}
_COPIED = {"model": "model", "temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens",
           "user": "user", "safety_identifier": "user", "stream": "stream"}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions body that serves this Responses request; ApiError (400) naming what is refused."""
    for key in body:
        if key in _REFUSED and body[key] not in (None, [], "none", "auto", False):
            raise ApiError(400, f"{key}: not supported by this server's /v1/responses (text in, text out); use "
                                "/v1/chat/completions for tools", param=key, code="unsupported_parameter")
        if key not in _REFUSED and key not in _IGNORED and key not in _COPIED and key not in ("input",
                                                                                            "instructions", "text"):
            raise ApiError(400, f"{key}: unknown parameter for /v1/responses", param=key,
                           code="unknown_parameter")
    chat = {_COPIED[k]: v for k, v in body.items() if k in _COPIED}
    if chat.get("stream") is True:
        chat["stream_options"] = {"include_usage": True}  # the usage closes the response.completed event
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "instructions: a string", param="instructions")
    chat["messages"] = ([{"role": "system", "content": instructions}] if instructions else []) + _messages(
        body.get("input"))
    fmt = _format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    return chat


def _messages(value: Any) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "input: a string, or a non-empty list of messages", param="input")
    messages = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict) or item.get("type", "message") != "message" or item.get("role") not in _ROLES:
            raise ApiError(400, f"{where}: only messages (role user, assistant, system or developer) with text are "
                                "served here", param=where)
        content = item.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
                       and isinstance(p.get("text"), str) for p in content):
                raise ApiError(400, f"{where}.content: only input_text/output_text parts are served here",
                               param=f"{where}.content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ApiError(400, f"{where}.content: a string or a list of text parts", param=f"{where}.content")
        messages.append({"role": _ROLES[item["role"]], "content": content})
    return messages


def _format(text: Any) -> dict[str, Any] | None:
    """``text.format`` as a chat ``response_format``."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise ApiError(400, "text.format.type: text, json_object or json_schema", param="text.format")


# --- answers -------------------------------------------------------------------------------------------------
def _ids(chat_id: str) -> tuple[str, str]:
    tail = chat_id.split("-", 1)[-1]
    return f"resp_{tail}", f"msg_{tail}"


def _message(msg_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": msg_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _response(request: dict[str, Any], chat: dict[str, Any], status: str, output: list, usage: dict | None,
              reason: str | None) -> dict[str, Any]:
    resp_id, _ = _ids(chat["id"])
    incomplete = {"reason": "max_output_tokens"} if reason == "length" else None
    return {"id": resp_id, "object": "response", "created_at": chat.get("created", int(time.time())),
            "status": "incomplete" if incomplete and status == "completed" else status, "model": chat.get("model"),
            "system_fingerprint": chat.get("system_fingerprint"), "output": output, "error": None,
            "incomplete_details": incomplete, "instructions": request.get("instructions"),
            "max_output_tokens": request.get("max_output_tokens"), "metadata": request.get("metadata") or {},
            "parallel_tool_calls": False, "temperature": request.get("temperature"), "top_p": request.get("top_p"),
            "tool_choice": "none", "tools": [], "text": request.get("text") or {"format": {"type": "text"}},
            "usage": None if usage is None else {
                "input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage["total_tokens"]}}


def response_object(request: dict[str, Any], chat: dict[str, Any]) -> dict[str, Any]:
    """A finished chat completion as a ``response`` object."""
    choice = chat["choices"][0]
    status = "incomplete" if choice["finish_reason"] == "length" else "completed"
    _, msg_id = _ids(chat["id"])
    return _response(request, chat, "completed", [_message(msg_id, choice["message"]["content"] or "", status)],
                     chat["usage"], choice["finish_reason"])


async def stream_events(request: dict[str, Any], chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Chat completion chunks (SSE) in, Responses events (SSE) out."""
    seq = 0

    def event(kind: str, **fields) -> bytes:
        nonlocal seq
        seq += 1
        data = {"type": kind, "sequence_number": seq - 1, **fields}
        return f"event: {kind}\ndata: ".encode() + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"

    try:
        async for event_bytes in _translate(request, chunks, event):
            yield event_bytes
    finally:
        await chunks.aclose()  # a client that left: the chat stream's own clean-up (audit, cancel) runs now


async def _translate(request: dict[str, Any], chunks, event) -> AsyncIterator[bytes]:
    text, reason, usage, head, msg_id = [], None, None, None, ""
    async for raw in chunks:
        data = raw.decode().removeprefix("data: ").strip()
        if data == "[DONE]":
            continue  # (read on to the chat stream's end, so its audit record is written as for chat)
        chunk = json.loads(data)
        if "error" in chunk:
            error = chunk["error"]
            yield event("error", code=error.get("code"), message=error.get("message"), param=error.get("param"))
            if head is not None:
                failed = _response(request, head, "failed", [], None, None)
                failed["error"] = {"code": str(error.get("code") or "server_error"), "message": error.get("message")}
                yield event("response.failed", response=failed)
            async for _ in chunks:  # read the chat stream to its end: its audit record is the error's, as for chat
                pass
            return
        if head is None:
            head = chunk
            msg_id = _ids(chunk["id"])[1]
            yield event("response.created", response=_response(request, chunk, "in_progress", [], None, None))
            yield event("response.in_progress", response=_response(request, chunk, "in_progress", [], None, None))
            item = {**_message(msg_id, "", "in_progress"), "content": []}
            yield event("response.output_item.added", output_index=0, item=item)
            yield event("response.content_part.added", item_id=msg_id, output_index=0, content_index=0,
                        part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                text.append(piece)
                yield event("response.output_text.delta", item_id=msg_id, output_index=0, content_index=0,
                            delta=piece, logprobs=[])
            reason = choice.get("finish_reason") or reason
    if head is None:
        return
    whole, status = "".join(text), "incomplete" if reason == "length" else "completed"
    part = {"type": "output_text", "text": whole, "annotations": [], "logprobs": []}
    yield event("response.output_text.done", item_id=msg_id, output_index=0, content_index=0, text=whole,
                logprobs=[])
    yield event("response.content_part.done", item_id=msg_id, output_index=0, content_index=0, part=part)
    message = _message(msg_id, whole, status)
    yield event("response.output_item.done", output_index=0, item=message)
    final = _response(request, head, "completed", [message], usage, reason)
    yield event("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)


def add_responses_route(app: FastAPI, server: Server) -> None:
    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        try:
            body = parse_body(await request.body())
            chat = json.dumps(chat_body(body)).encode()
        except ApiError as error:  # refused before it became a chat request: still its one audit record
            from meshlm.serve.server import Exchange

            exchange = Exchange("chat", request.url.path, "chatcmpl-" + uuid.uuid4().hex)
            exchange.fail(error)
            await server._finish(exchange)
            return error_response(error)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": chat, "more_body": False}

        answer = await server.complete(Request(request.scope, receive), "chat")
        if isinstance(answer, StreamingResponse):
            answer.body_iterator = stream_events(body, answer.body_iterator)
            return answer
        if answer.status_code != 200 or not isinstance(answer, JSONResponse):
            return answer
        return JSONResponse(response_object(body, json.loads(answer.body)))
