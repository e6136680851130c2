"""Tools over HTTP with the openai client: the tools reach a template that renders them, a required or named
tool_choice makes the answer a call (parsed into tool_calls, arguments valid for the function's schema, streamed
or not), tool results can be sent back, and a model whose template has no tool support answers 400 saying so.
The parser is checked on the shapes common templates teach."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from meshlm.serve.fixtures import random_checkpoints
from meshlm.serve.registry import Registry
from meshlm.serve.tools import parse_tool_calls
from tests.test_registry import write_report
from tests.test_serve_fields import start_in_process

# A Hermes-style template (as Qwen 2.5's): the tools in the system turn, calls in <tool_call> tags. (Only the
# names: the debug model's context is 256 tokens.)
TEMPLATE = """{%- if tools %}system: tools {% for t in tools %}{{ t.function.name }} {% endfor %}
{% endif %}
{%- for m in messages %}{{ m.role }}: {% if m.tool_calls %}{% for c in m.tool_calls -%}
<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}
{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"""

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,8}$"},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Local time",
                                           "parameters": {"type": "object", "properties": {"tz": {"enum": ["utc"]}},
                                                          "required": ["tz"], "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("tools")
    with_tools, = random_checkpoints(root / "run", steps=(1,))
    (with_tools / "chat_template.jinja").write_text(TEMPLATE)
    plain, = random_checkpoints(root / "plain", steps=(2,))  # meshlm's own template: no tools
    reg = Registry(root / "reg.sqlite")
    reg.add_checkpoint(with_tools, "agent", write_report(root / "pass.json", True))
    reg.add_checkpoint(plain, "plain", root / "pass.json")
    yield from start_in_process(reg, ["agent:v1", "plain:v1"])
    reg.close()


def test_required_tool_choice_is_a_valid_call(served):
    client = served.client()
    out = client.chat.completions.create(model="agent", messages=ASK, tools=TOOLS, tool_choice="required",
                                         max_tokens=64, temperature=1.0, seed=3, n=3)
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), schema)
    plain = client.chat.completions.create(model="agent", messages=ASK, max_tokens=2)
    assert out.usage.prompt_tokens > plain.usage.prompt_tokens  # the template rendered the tools


def test_named_tool_choice_streamed(served):
    client = served.client()
    choice = {"type": "function", "function": {"name": "get_weather"}}
    whole = client.chat.completions.create(model="agent", messages=ASK, tools=TOOLS, tool_choice=choice,
                                           max_tokens=64, temperature=1.0, seed=8)
    call = whole.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    chunks = list(client.chat.completions.create(model="agent", messages=ASK, tools=TOOLS, tool_choice=choice,
                                                 max_tokens=64, temperature=1.0, seed=8, stream=True))
    deltas = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    assert [(d.function.name, d.function.arguments) for d in deltas] == [(call.function.name,
                                                                          call.function.arguments)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # The call and its result go back to the model as the next turn.
    follow = ASK + [{"role": "assistant", "content": None, "tool_calls": [whole.choices[0].message.tool_calls[0]
                                                                         .model_dump()]},
                    {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
    again = client.chat.completions.create(model="agent", messages=follow, tools=TOOLS, max_tokens=4)
    assert again.usage.prompt_tokens > whole.usage.prompt_tokens


def test_a_template_without_tools_is_a_400(served):
    with pytest.raises(openai.BadRequestError) as err:
        served.client().chat.completions.create(model="plain", messages=ASK, tools=TOOLS, max_tokens=4)
    body = err.value.body
    assert body["code"] == "tools_unsupported" and "no tool support" in body["message"]
    ok = served.client().chat.completions.create(model="plain", messages=ASK, tools=TOOLS, tool_choice="none",
                                                 max_tokens=2)  # "none": the tools are not used at all
    assert ok.choices[0].message.tool_calls is None


@pytest.mark.parametrize("tools, choice, param", [
    ([{"type": "function", "function": {}}], "auto", "tools.0"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
    (TOOLS, "sometimes", "tool_choice"),
])
def test_bad_tools_are_400(served, tools, choice, param):
    with pytest.raises(openai.BadRequestError) as err:
        served.client().chat.completions.create(model="agent", messages=ASK, tools=tools, tool_choice=choice,
                                                max_tokens=4)
    assert err.value.body["param"] == param


def test_parser_reads_the_common_shapes():
    names = ["get_weather", "get_time"]
    content, calls = parse_tool_calls('Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "oslo"}}'
                                      '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
                                      names)
    assert content == "Sure." and [c["function"]["name"] for c in calls] == names
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "oslo"}
    content, calls = parse_tool_calls('{"name": "get_time", "parameters": {"tz": "utc"}}', names)  # Llama 3.1
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"tz": "utc"}
    assert parse_tool_calls('[{"name": "get_time", "arguments": {}}]', names)[1][0]["function"]["name"] == "get_time"
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text, names) == (text, [])  # a function nobody offered is not a call
    assert parse_tool_calls("just text {not json}", names) == ("just text {not json}", [])
