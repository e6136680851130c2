"""POST /v1/responses with the official openai client's Responses calls (create, create(stream=True), stream,
parse): the same answer as /v1/chat/completions for the same messages (one engine path), structured output via
text.format, the usage counted, one audit record at /v1/responses, and a 400 naming what is not served.

In-process server (uvicorn on 127.0.0.1, port 0) on a random-weight debug checkpoint; greedy decoding, so the two
endpoints must agree token for token."""

from __future__ import annotations

import json
import time
from typing import Annotated

import httpx2
import openai
import pydantic
import pytest

from tests.test_serve_fields import serve_tiny


class Person(pydantic.BaseModel):  # bounded: a constrained answer always closes within the token budget
    name: Annotated[str, pydantic.Field(pattern="^[a-z]{1,6}$")]
    age: Annotated[int, pydantic.Field(ge=0, le=120)]
    ok: bool


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from serve_tiny(tmp_path_factory, "responses")


def test_create_equals_chat_completions(served):
    client = served.client()
    chat = client.chat.completions.create(model="tiny", max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}])
    resp = client.responses.create(model="tiny", instructions="Be brief.", input="Say something.",
                                   max_output_tokens=8, temperature=0)
    assert resp.object == "response" and resp.id.startswith("resp_") and resp.model == "tiny"
    assert resp.output_text == chat.choices[0].message.content
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert resp.system_fingerprint == "tiny:v1"
    as_list = client.responses.create(model="tiny", max_output_tokens=8, temperature=0, input=[
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say something."}]}])
    assert as_list.output_text == resp.output_text  # developer -> system, text parts joined
    record = served.audit.records[-1]
    assert record["endpoint"] == "/v1/responses" and record["status"] == 200


def test_streamed_events_rebuild_the_same_answer(served):
    client = served.client()
    whole = client.responses.create(model="tiny", input="Tell me more.", max_output_tokens=12, temperature=0)
    events = list(client.responses.create(model="tiny", input="Tell me more.", max_output_tokens=12, temperature=0,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-1] == f"response.{whole.status}" and [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    record = served.audit.records[-1]  # the stream's own record, written when it ended
    assert record["endpoint"] == "/v1/responses" and record["stream"] is True and record["status"] == 200
    assert record["response"] == whole.output_text and record.get("client") is None


def test_a_client_that_leaves_a_stream_is_audited_once(served):
    before = len(served.audit.records)
    body = {"model": "tiny", "input": "go on", "max_output_tokens": 90, "stream": True}
    with httpx2.stream("POST", served.url + "/v1/responses", json=body, timeout=60) as r:
        assert r.status_code == 200 and next(r.iter_lines()).startswith("event: response.created")
    deadline = time.monotonic() + 60
    while len(served.audit.records) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(served.audit.records) == before + 1
    assert served.audit.records[-1]["endpoint"] == "/v1/responses"


def test_parse_and_stream_with_a_pydantic_text_format(served):
    client = served.client()
    parsed = client.responses.parse(model="tiny", input="Describe a person.", text_format=Person,
                                    max_output_tokens=64, temperature=0)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Person)
    assert Person.model_validate_json(parsed.output_text) == parsed.output_parsed
    with client.responses.stream(model="tiny", input="Describe a person.", text_format=Person,
                                 max_output_tokens=64, temperature=0) as stream:
        final = stream.get_final_response()
    assert final.output_parsed == parsed.output_parsed


@pytest.mark.parametrize("extra, param", [({"tools": [{"type": "web_search"}]}, "tools"),
                                          ({"previous_response_id": "resp_1"}, "previous_response_id"),
                                          ({"frequency": 1}, "frequency")])
def test_what_is_not_served_is_a_400_naming_it(served, extra, param):
    before = len(served.audit.records)
    with pytest.raises(openai.BadRequestError) as err:
        served.client().responses.create(model="tiny", input="hi", extra_body=extra)
    assert err.value.body["param"] == param and param in err.value.body["message"]
    assert len(served.audit.records) == before + 1 and served.audit.records[-1]["status"] == 400


def test_an_image_input_is_refused_by_position(served):
    with pytest.raises(openai.BadRequestError) as err:
        served.client().responses.create(model="tiny", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}])
    assert err.value.body["param"] == "input[0].content"
    assert json.dumps(served.audit.records[-1]).count("example.com") == 0  # refused before it was recorded
