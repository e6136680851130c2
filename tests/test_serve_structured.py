"""Structured outputs over HTTP with the openai client: every answer under ``response_format`` json_schema or
json_object parses and validates (jsonschema), even from a random-weight model sampling at temperature 1;
constrained and free rows decode in the same batch; a schema the engine cannot enforce is a 400."""

from __future__ import annotations

import json
import threading

import jsonschema
import openai
import pytest

from tests.test_serve_fields import serve_tiny

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "blue", "green"]}, "maxItems": 3},
        "address": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["zip"], "additionalProperties": False},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "address", "ok"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from serve_tiny(tmp_path_factory, "structured")


def test_json_schema_answers_validate(served):
    client = served.client()
    messages = [{"role": "user", "content": "Describe a person."}]
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=96, temperature=1.0, seed=2,
                                         n=6, response_format=FORMAT)
    for choice in out.choices:  # the bounded schema fits in 96 tokens, so every answer closes
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    streamed = client.chat.completions.create(model="tiny", messages=messages, max_tokens=96, temperature=1.0,
                                              seed=2, response_format=FORMAT, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == out.choices[0].message.content  # same seed, same constrained sample
    done = client.completions.create(model="tiny", prompt="{", max_tokens=96, temperature=0,
                                     extra_body={"response_format": FORMAT})  # not in the client's signature
    jsonschema.validate(json.loads(done.choices[0].text), PERSON)  # greedy under the mask, completions too


def test_json_object_answers_parse(served):
    client = served.client()
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "JSON please"}],
                                         max_tokens=96, temperature=1.0, seed=4, n=8,
                                         response_format={"type": "json_object"})
    closed = [c for c in out.choices if c.finish_reason == "stop"]
    for choice in out.choices:  # an unbounded object may run out of tokens; what is there is a JSON prefix
        assert choice.message.content.startswith("{")
    assert closed, [c.message.content for c in out.choices]
    for choice in closed:
        assert isinstance(json.loads(choice.message.content), dict)


def test_constrained_and_free_rows_share_the_batch(served):
    client, engine = served.client(), served.backend("tiny:v1").engine
    before = engine.status()
    results: dict[str, object] = {}

    def ask(key: str, **kw) -> None:
        results[key] = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=96,
                                                 temperature=1.0, seed=9, **kw)

    threads = [threading.Thread(target=ask, args=("free",)),
               threading.Thread(target=ask, args=("json",), kwargs={"extra_body": {"response_format": FORMAT}})]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    after = engine.status()
    jsonschema.validate(json.loads(results["json"].choices[0].text), PERSON)
    tokens = sum(r.usage.completion_tokens for r in results.values())
    assert after["tokens"] - before["tokens"] == tokens
    # Decoded together: fewer forwards than tokens (a step advances both rows).
    assert after["decode_steps"] - before["decode_steps"] + after["prefills"] - before["prefills"] < tokens
    alone = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=96, temperature=1.0,
                                      seed=9)
    assert alone.choices[0].text == results["free"].choices[0].text  # the free row is untouched by its neighbour


@pytest.mark.parametrize("fmt, param", [
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, "response_format"),
    ({"type": "yaml"}, "response_format.type"),
])
def test_bad_response_format_is_a_400(served, fmt, param):
    with pytest.raises(openai.BadRequestError) as err:
        served.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                                max_tokens=4, response_format=fmt)
    assert err.value.body["param"] == param, err.value.body
