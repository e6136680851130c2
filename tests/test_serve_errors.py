"""The HTTP layer when a backend breaks (a bug, not bad input): an OpenAI error object, no traceback, and still
exactly one audit record per request. In-process: uvicorn in a thread on a free loopback port, stub backends."""

from __future__ import annotations

import threading
import time

import httpx2
import pytest

from meshlm.serve.audit import AuditLog
from meshlm.serve.audit_verify import export
from meshlm.serve.launch import bind
from meshlm.serve.protocol import Delta
from meshlm.serve.registry import Registry
from meshlm.serve.rollout import Deployment, Router
from meshlm.serve.server import Server


class Broken:
    """submit() itself raises."""

    ref = "broken:v1"

    async def submit(self, job):
        raise RuntimeError("a bug with a secret alice@example.com inside")

    def status(self):
        return {}

    async def aclose(self):
        pass


class BreaksMidway(Broken):
    """Sends some text, then its event stream raises."""

    ref = "midway:v1"

    async def submit(self, job):
        return self

    async def events(self):
        yield Delta("partial ")
        raise RuntimeError("engine exploded")

    def cancel(self):
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import uvicorn

    root = tmp_path_factory.mktemp("errors")
    router = Router(Registry(root / "reg.sqlite"), load=None, user_key="k" * 32)
    for backend in (Broken(), BreaksMidway()):
        name = backend.ref.split(":")[0]
        router.deployments[name] = Deployment(name, 1)
        router.backends[backend.ref] = backend
    logs: list[str] = []
    audit = AuditLog(root / "audit.sqlite")
    server = uvicorn.Server(uvicorn.Config(Server(router, audit, None, log=logs.append).app, log_level="warning",
                                           access_log=False, lifespan="off"))
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", root / "audit.sqlite", logs
    server.should_exit = True
    thread.join(10)
    audit.close()


@pytest.mark.parametrize("model, stream", [("broken", False), ("broken", True), ("midway", False),
                                           ("midway", True)])
def test_internal_errors_are_error_objects(served, model, stream):
    url, _, _ = served
    r = httpx2.post(url + "/v1/chat/completions", json={"model": model, "stream": stream,
                                                        "messages": [{"role": "user", "content": "hi"}]})
    assert "Traceback" not in r.text and "alice" not in r.text
    if stream and model == "midway":  # the stream had begun (200): it ends with an error event
        assert r.status_code == 200 and '"internal server error"' in r.text and "partial" in r.text
    else:
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"


def test_each_broken_request_has_one_record(served):
    _, audit, logs = served
    records = [r for r in export(audit) if r["kind"] == "request"]
    assert len(records) == 4 and all(r["status"] == 500 for r in records)
    assert {r["version"] for r in records} == {"broken:v1", "midway:v1"}
    assert not any("alice" in line or "exploded" in line for line in logs)  # exception text never logged


def test_non_finite_json_constants_are_refused_and_audited(served):
    """Python's json reads NaN/Infinity; a refused request's raw prompt holding one once broke the audit write
    (500, no record). Now: 400 invalid_json naming the constant, and its one record."""
    url, audit, _ = served
    before = len(export(audit))
    r = httpx2.post(url + "/v1/chat/completions", headers={"Content-Type": "application/json"},
                    content=b'{"model": "broken", "messages": [{"role": "user", "content": NaN}]}')
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text
    assert "NaN" in r.json()["error"]["message"]
    records = export(audit)[before:]
    assert len(records) == 1 and records[0]["status"] == 400


def test_sanitize_value_keeps_non_finite_floats_as_text():
    import json

    from meshlm.serve.audit import sanitize_value
    clean = sanitize_value({"a": float("nan"), "b": [float("inf"), -float("inf")], "c": 1.5})
    assert json.loads(json.dumps(clean, allow_nan=False)) == {"a": "nan", "b": ["inf", "-inf"], "c": 1.5}


def test_a_metrics_error_keeps_the_audit_record(tmp_path):
    import asyncio

    from meshlm.serve.server import Exchange

    class Records:
        def __init__(self):
            self.records = []

        def append(self, record):
            self.records.append(record)

    def broken_observe(ex):
        raise ValueError("Counters can only be incremented by non-negative amounts.")

    audit, logs = Records(), []
    server = Server(Router(Registry(tmp_path / "reg.sqlite"), load=None, user_key="k" * 32), audit, None,
                    log=logs.append)
    server.metrics.observe = broken_observe
    ex = Exchange("chat", "/v1/chat/completions", "chatcmpl-metrics")
    asyncio.run(server._finish(ex))
    assert [r["request_id"] for r in audit.records] == ["chatcmpl-metrics"]
    assert any("metrics not updated (ValueError)" in line for line in logs), logs


def test_a_remotes_token_counts_are_clamped_to_non_negative_ints():
    import asyncio
    import json

    from meshlm.serve.gateway import RemoteHandle
    from meshlm.serve.protocol import Finished

    class Upstream:
        def __init__(self, usage):
            self.usage = usage

        async def aiter_lines(self):
            yield "data: " + json.dumps({"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}],
                                         "usage": self.usage})
            yield "data: [DONE]"

        async def aclose(self):
            pass

    async def finished(usage):
        return [e async for e in RemoteHandle(Upstream(usage), "chat").events()][-1]

    for usage, counts in (({"prompt_tokens": -5, "completion_tokens": -2}, (0, 0)),
                          ({"prompt_tokens": "x", "completion_tokens": 3.7}, (0, 3)),
                          ({"prompt_tokens": 1e400, "completion_tokens": [1]}, (0, 1))):
        event = asyncio.run(finished(usage))
        assert isinstance(event, Finished) and (event.prompt_tokens, event.completion_tokens) == counts, event
