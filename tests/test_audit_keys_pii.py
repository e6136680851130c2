"""Issue 32, item 3: private data reached the audit database through dictionary keys (a message keyed by an
e-mail address, a tool call keyed by a card number, a prompt sent as an object) and through JSON numbers. Every
string a client controls is sanitized now, keys included, a key that names an identifier labels its value, and a
refused request is stored only in its sanitized form. Real SQLite; the HTTP test runs a real server on loopback
and sends with the official openai client."""

from __future__ import annotations

import threading
import time

import httpx2
import openai
import pytest

from meshlm.serve.audit import AuditLog, canonical_json, sanitize_record
from meshlm.serve.audit_verify import export, verify
from meshlm.serve.launch import bind
from meshlm.serve.protocol import Delta, Finished
from meshlm.serve.registry import Registry
from meshlm.serve.rollout import Deployment, Router
from meshlm.serve.server import Server

EMAIL, CARD, SSN = "jane.roe@example.com", "4111111111111111", "536-22-8714"
RAW = [EMAIL, CARD, "4111 1111 1111 1111", SSN, "536228714", "987654321", "+44 20 7946 0958"]


def stored(record: dict) -> str:
    return canonical_json(sanitize_record({"kind": "request", **record})).decode()


def test_keys_are_sanitized_like_values():
    text = stored({"messages": [{"role": "wizard", EMAIL: "x"}],
                   "prompt": {EMAIL: {"note": "hi"}, f"call {'+44 20 7946 0958'}": 1},
                   "tools": [{"tool_calls": [{CARD: {"id": "call_1"}}, {"4111 1111 1111 1111": []}]}]})
    for raw in RAW:
        assert raw not in text, text
    assert "<EMAIL>" in text and "<CREDIT_CARD>" in text and "<PHONE>" in text


def test_keys_that_collide_after_sanitizing_keep_every_value():
    clean = sanitize_record({"kind": "request", "prompt": {"a.b@example.com": 1, "c.d@example.org": 2,
                                                           "e.f@example.net": 3}})
    assert clean["prompt"] == {"<EMAIL>": 1, "<EMAIL>#2": 2, "<EMAIL>#3": 3}


@pytest.mark.parametrize("field, value, placeholder", [
    ("ssn", "987654321", "<US_SSN>"),  # not a valid SSN: only the key says what it is
    ("customerSSN", "987 65 4321", "<US_SSN>"),
    ("social_security_number", "987-65-4321", "<US_SSN>"),
    ("cardNumber", "4111 1111 1111 1112", "<CREDIT_CARD>"),  # bad Luhn, but named a card
    ("passport_no", "C03005988", "<PASSPORT>"),
    ("iban", "GB00 NWBK 6016 1331 9268 19", "<IBAN>"),
    ("phone", "4155552671", "<PHONE>"),
    ("first_name", "Olivia", "<PERSON>"),
    ("api_key", "zq8mP2xRk5YczUJ4zIKd", "<API_KEY>"),
])
def test_a_key_that_names_an_identifier_labels_its_value(field, value, placeholder):
    clean = sanitize_record({"kind": "request", "form": {field: value}})["form"][field]
    assert clean == placeholder


@pytest.mark.parametrize("field, value", [("ssn", 987654321), ("card", 4111111111111112), ("n", 4111111111111111),
                                          ("accountNumber", 48201193)])
def test_identifiers_sent_as_numbers_are_masked(field, value):
    clean = sanitize_record({"kind": "request", "form": {field: value}})["form"][field]
    assert isinstance(clean, str) and clean.startswith("<") and str(value) not in clean


def test_ordinary_numbers_and_fields_are_kept():
    record = {"prompt": [15496, 11, 616, 3290, 49151], "max_tokens": 16384, "seed": 123456789, "n": 2,
              "temperature": 0.7, "order_id": "5019-7170-1010", "messages": [{"role": "user", "content": "v1.2.3"}],
              "zip": 94107, "latency_s": 1234567.5}
    clean = sanitize_record({"kind": "request", **record})
    assert {k: clean[k] for k in record} == record


def test_nesting_deeper_than_json_dumps_allows_is_stored_as_sanitized_text(tmp_path):
    value: object = f"my ssn {SSN}"
    for _ in range(900):
        value = {"k": [value]}
    with AuditLog(tmp_path / "a.db") as log:
        log.append({"kind": "request", "prompt": value})
    blob = (tmp_path / "a.db").read_bytes()
    assert SSN.encode() not in blob and b"<US_SSN>" in blob and verify(tmp_path / "a.db").ok


class Echo:
    """A backend that answers every request with a fixed text."""

    ref = "echo:v1"

    async def submit(self, job):
        return self

    async def events(self):
        yield Delta("ok")
        yield Finished("stop", 3, 1)

    def cancel(self):
        pass

    def status(self):
        return {}

    async def aclose(self):
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import uvicorn

    root = tmp_path_factory.mktemp("keys")
    router = Router(Registry(root / "reg.sqlite"), load=None, user_key="k" * 32)
    router.deployments["echo"] = Deployment("echo", 1)
    router.backends[Echo.ref] = Echo()
    audit = AuditLog(root / "audit.sqlite")
    server = uvicorn.Server(uvicorn.Config(Server(router, audit, None, log=lambda line: None).app,
                                           log_level="warning", access_log=False, lifespan="off"))
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", root
    server.should_exit = True
    thread.join(10)
    audit.close()


def test_refused_and_accepted_requests_store_no_pii_in_keys(served):
    url, root = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="echo", messages=[{"role": "wizard", EMAIL: "x"}])
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="echo", prompt={EMAIL: "x", "ssn": 987654321})
    try:  # refused or served, whichever the schema decides: its record is what matters here
        client.chat.completions.create(model="echo", messages=[
            {"role": "assistant", "content": None, "tool_calls": [{CARD: {"ssn": "987654321"}}]}])
    except openai.BadRequestError:
        pass
    answer = client.chat.completions.create(model="echo", messages=[
        {"role": "user", "content": f"card {CARD}", "name": "Olivia Bennett"}])
    assert answer.choices[0].message.content == "ok"
    # a body that is not an OpenAI request at all (raw HTTP): still one record, sanitized
    r = httpx2.post(url + "/v1/chat/completions", json={"model": "echo", "messages": {EMAIL: [SSN]}})
    assert r.status_code == 400
    records = [r for r in export(root / "audit.sqlite") if r["kind"] == "request"]
    assert len(records) == 5 and [r["status"] for r in records].count(400) >= 3
    blob = b"".join(p.read_bytes() for p in root.iterdir() if p.name.startswith("audit.sqlite"))
    for raw in RAW + ["Olivia Bennett"]:
        assert raw.encode() not in blob, raw
    assert b"<EMAIL>" in blob and b"<CREDIT_CARD>" in blob


def test_a_sibling_that_names_an_identifier_labels_the_values_beside_it():
    """{"field": "SSN", "value": …} and a tool call named update_ssn whose arguments hold the numbers."""
    import json

    record = {"messages": [{"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "update_ssn", "arguments": json.dumps({"old": "987654321", "new": "987654322"})}}]}],
        "form": [{"field": "SSN", "value": "987-65-4321"}, {"field": "card", "value": "4111 1111 1111 1112"}]}
    text = stored(record)
    for raw in ("987654321", "987654322", "987-65-4321", "4111 1111 1111 1112"):
        assert raw not in text, text
    assert '"name":"update_ssn"' in text and '"field":"SSN"' in text
