"""Tools: OpenAI ``tools`` / ``tool_choice`` for models whose chat template renders them, and the calls parsed
back out of the generated text into ``tool_calls``.

The tools go to the template as its ``tools`` variable (as ``apply_chat_template(tools=...)`` does), so the model
sees them the way it was trained to. A template that ignores that variable (meshlm's own, SmolLM2's, most base
models') cannot offer tools: the request is a 400 saying so, rather than a model that silently never calls.
What comes back is searched for the two shapes common templates teach: Hermes/Qwen's
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (one or more) and a bare JSON object or list of
them (Llama 3.1's ``{"name": ..., "parameters": {...}}``). Only names the request offered count as calls.
``tool_choice`` "required" or a named function constrains decoding to such an object (the grammar engine of
:mod:`meshlm.serve.grammar`), so the answer is always a call.
"""

from __future__ import annotations

import inspect
import json
import re
import uuid
from typing import Any

from meshlm.serve.protocol import ApiError

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_PROBE = [{"type": "function", "function": {"name": "meshlm_probe_tool", "description": "probe",
                                             "parameters": {"type": "object", "properties": {}}}}]


def check_tools(tools: list[dict[str, Any]], tool_choice: Any) -> list[str]:
    """The offered function names; ApiError 400 for a malformed list or a choice naming no offered tool."""
    names = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(400, f"tools.{i}: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                           param=f"tools.{i}")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise ApiError(400, f"tools.{i}.function.parameters: a JSON Schema object", param=f"tools.{i}")
        names.append(fn["name"])
    named = forced_name(tool_choice)
    if tool_choice not in (None, "none", "auto", "required") and named is None:
        raise ApiError(400, "tool_choice: none, auto, required or {\"type\": \"function\", \"function\": "
                            "{\"name\": ...}}", param="tool_choice")
    if named is not None and named not in names:
        raise ApiError(400, "tool_choice names a function that is not in tools", param="tool_choice")
    return names


def forced_name(tool_choice: Any) -> str | None:
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        fn = tool_choice.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"]
    return None


def call_format(tools: list[dict[str, Any]], tool_choice: Any) -> dict[str, Any] | None:
    """For "required" or a named function: the response_format that makes the answer one call."""
    if tool_choice != "required" and forced_name(tool_choice) is None:
        return None
    chosen = [t["function"] for t in tools if forced_name(tool_choice) in (None, t["function"]["name"])]
    shapes = [{"type": "object", "properties": {"name": {"const": fn["name"]},
                                                "arguments": fn.get("parameters") or {"type": "object"}},
               "required": ["name", "arguments"], "additionalProperties": False} for fn in chosen]
    schema = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
    return {"type": "json_schema", "json_schema": {"schema": schema}}


def encode_with_tools(template, messages: list[dict[str, Any]], tools: list[dict[str, Any]], where: str) -> list[int]:
    """The prompt with the tools rendered by the template; ApiError 400 when it has no tool support."""
    if "tools" not in inspect.signature(template.encode_prompt).parameters or \
            template.encode_prompt(messages, where=where, tools=_PROBE) == template.encode_prompt(messages,
                                                                                                  where=where):
        raise ApiError(400, "tools: this model's chat template has no tool support (it does not render a tools "
                            "list); serve a model whose template does, or describe the tools in the messages",
                       param="tools", code="tools_unsupported")
    return template.encode_prompt(messages, where=where, tools=tools)


def parse_tool_calls(text: str, names: list[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """(the text left outside the calls, or None; the calls as OpenAI ``tool_calls``) from a generated answer."""
    calls, rest = [], text
    tagged = list(_TAGGED.finditer(text))
    if tagged:
        for m in tagged:
            calls += _calls_in(m.group(1), names)
        if calls:
            rest = _TAGGED.sub("", text)
    else:
        calls = _calls_in(text.strip(), names)
        if calls:
            rest = ""
    rest = rest.strip()
    return (rest or None) if calls else text, calls


def _calls_in(raw: str, names: list[str]) -> list[dict[str, Any]]:
    try:
        value = json.loads(raw)
    except ValueError:
        return []
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            return []
        args = item.get("arguments", item.get("parameters", {}))
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": item["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return calls
