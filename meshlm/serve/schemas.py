"""OpenAI request schemas (the fields this server implements) and their validation into a :class:`Job`.

Types are strict (``"0.5"`` is not a temperature), unknown fields are ignored as the OpenAI API's many optional
fields are, but a field that would change the answer in a way this server does not implement (``best_of``,
``suffix``, ``functions`` ...) is refused with a 400 rather than silently ignored.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from meshlm.serve.protocol import ApiError, Job, Sampling
from meshlm.serve.tools import call_format, check_tools

MAX_BODY_BYTES = 8 << 20
MAX_MESSAGES = 2048  # chat messages in one request (each takes a few tokens of the context at least)
MAX_STOP_CHARS = 512  # one stop string (the engine checks every stop string's prefixes at each token)
INT64 = (-(1 << 63), (1 << 63) - 1)  # seed: a signed 64-bit integer, as OpenAI's


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # None only beside an assistant's tool_calls
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls (passed to the template)
    tool_call_id: str | None = None  # a tool result answers this call

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls is not None:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaFormat(_Strict):
    name: str = Field("response", max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def as_dict(self) -> dict[str, Any] | None:
        if self.type == "text":
            return None
        if self.type == "json_schema" and self.json_schema is None:
            raise ApiError(400, "response_format.json_schema: required when type is json_schema",
                           param="response_format.json_schema")
        return {"type": self.type, "json_schema": {"schema": self.json_schema.schema_} if self.json_schema else None}


class _Common(_Strict):
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=INT64[0], le=INT64[1])
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=128)  # choices (the server's --max-batch bounds it too)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None

    def sampling(self, max_tokens: int | None, logprobs: int | None, echo: bool = False) -> Sampling:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > 4:
            raise ApiError(400, "stop: at most 4 stop sequences", param="stop")
        if any(len(s) > MAX_STOP_CHARS for s in stop):
            raise ApiError(400, f"stop: a stop sequence longer than {MAX_STOP_CHARS} characters", param="stop")
        return Sampling(max_tokens, self.temperature, self.top_p, self.seed, tuple(stop), self.n,
                        self.presence_penalty, self.frequency_penalty, _logit_bias(self.logit_bias), logprobs, echo)


def _logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` with biases in [-100, 100] -> (id, bias) pairs."""
    pairs = []
    for key, value in (bias or {}).items():
        if not (key.isascii() and key.isdigit()):  # "²".isdigit() is True, and int("²") fails
            raise ApiError(400, "logit_bias: keys are token ids written as strings (\"50256\")", param="logit_bias")
        if not -100 <= value <= 100:
            raise ApiError(400, f"logit_bias: the bias of token {key} is outside [-100, 100]", param="logit_bias")
        pairs.append((int(key), float(value)))
    return tuple(pairs)


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None

    def logprob_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int]
    logprobs: int | None = Field(None, ge=0, le=20)  # completions: the number of top log-probs per token
    echo: bool = False


# Fields whose non-default values this server cannot honour.
_UNSUPPORTED = {"functions": (None, []), "function_call": (None, "none"), "best_of": (None, 1), "suffix": (None,)}


class _NonFinite(Exception):
    """NaN, Infinity or -Infinity in a request body: Python's json accepts them, JSON does not."""


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


def parse_body(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB")
    try:
        body = json.loads(raw, parse_constant=_refuse_constant)
    except _NonFinite as error:
        raise ApiError(400, f"the request body is not valid JSON: {error.args[0]} is not a JSON value",
                       code="invalid_json") from None
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return body


def to_job(kind: str, body: dict[str, Any], request_id: str, user_hash_of) -> tuple[Job, _Common]:
    """Validate ``body`` for ``kind`` ("chat" or "completion") -> (job, the parsed request); ApiError 400."""
    schema = ChatRequest if kind == "chat" else CompletionRequest
    messages = body.get("messages")
    if kind == "chat" and isinstance(messages, list) and len(messages) > MAX_MESSAGES:  # before validating each
        raise ApiError(400, f"messages: {len(messages)} messages, above this server's limit of {MAX_MESSAGES}",
                       param="messages", code="too_many_messages")
    try:
        req = schema.model_validate(body)
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply", code="invalid_json") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(400, f"{where}: {first['msg']} ({exc.error_count()} problem(s) in the request)",
                       param=where) from None
    for key, allowed in _UNSUPPORTED.items():
        if key in body and body[key] not in allowed:
            raise ApiError(400, f"{key} is not supported by this server", param=key, code="unsupported_parameter")
    user_hash = user_hash_of(req.user)
    if isinstance(req, ChatRequest):
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        messages = [m.as_dict() for m in req.messages]
        tools = req.tools if req.tools and req.tool_choice != "none" else None
        response_format = _format(req)
        if tools is not None:
            check_tools(tools, req.tool_choice)
            forced = call_format(tools, req.tool_choice)
            if forced is not None and response_format is not None:
                raise ApiError(400, "response_format and a required tool_choice both constrain the answer; give one",
                               param="response_format")
            response_format = forced or response_format
        return Job("chat", request_id, req.sampling(max_tokens, req.logprob_count()), messages=messages,
                   body=body, user_hash=user_hash, response_format=response_format, tools=tools), req
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise ApiError(400, "prompt: one prompt per request (a list of one string)", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, list) and not prompt:
        raise ApiError(400, "prompt: empty", param="prompt")
    return Job("completion", request_id, req.sampling(req.max_tokens, req.logprobs, req.echo), prompt=prompt,
               body=body, user_hash=user_hash, response_format=_format(req)), req


def _format(req: _Common) -> dict[str, Any] | None:
    return req.response_format.as_dict() if req.response_format is not None else None
