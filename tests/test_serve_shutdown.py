"""Graceful shutdown of a real `meshlm serve` process: SIGTERM while a streaming request is in flight. The server
stops admitting (503 with code shutting_down, /health/ready 503, /health/live still 200), the stream finishes
whole, both requests are audited, and the process exits 0 once nothing is in flight.

The in-flight request is made deterministic without timing: the served version is an endpoint whose upstream (a
small streaming OpenAI-compatible server in this test) sends its first chunk and then holds the stream open until
the test releases it. The port file and the banner name the same base URL, which answers GET."""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2
import openai
import pytest

from meshlm.serve.audit_verify import export
from meshlm.serve.registry import Registry
from tests.helpers import meshlm_in_process
from tests.test_registry import write_report
from tests.test_serve import start_server, wait_ready


class HeldStream:
    """An upstream whose chat stream sends "Hello", waits for ``release``, then sends " world" and [DONE]."""

    def __init__(self) -> None:
        self.release = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self._json({"object": "list", "data": [{"id": "toy", "object": "model"}]})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self._event({"choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]})
                owner.release.wait(120)
                self._event({"choices": [{"index": 0, "delta": {"content": " world"}, "finish_reason": "stop"}]})
                self._event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
                self.wfile.write(b"data: [DONE]\n\n")

            def _event(self, data: dict) -> None:
                self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
                self.wfile.flush()

            def _json(self, data: dict) -> None:
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def upstream():
    server = HeldStream()
    yield server
    server.close()


def wait_for(check, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_sigterm_drains_an_in_flight_stream_and_refuses_new_requests(tmp_path, upstream):
    reg = Registry(tmp_path / "reg.sqlite")
    reg.add_endpoint(upstream.url, "relay", "toy", write_report(tmp_path / "pass.json", True))  # relay:v1
    reg.close()
    audit = tmp_path / "audit.sqlite"
    server = start_server(["--registry", str(tmp_path / "reg.sqlite"), "--model", "relay:v1", "--audit", str(audit)],
                          tmp_path / "srv")
    try:
        wait_ready(server, tmp_path / "srv")
        port_file = json.loads((tmp_path / "srv" / "port.json").read_text())
        assert port_file["base_url"] == server.url + "/v1"
        assert f"on {server.url} (OpenAI base URL {port_file['base_url']};" in server.log.read_text()
        assert httpx2.get(port_file["base_url"]).json()["base_url"] == port_file["base_url"]  # GET /v1 answers

        client = openai.OpenAI(base_url=port_file["base_url"], api_key="unused", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "hi"}]
        stream = iter(client.chat.completions.create(model="relay", messages=messages, stream=True))
        texts = []
        while not texts:  # the role chunk first, then "Hello": the request is now in flight, held upstream
            texts = [c.delta.content for c in next(stream).choices if c.delta.content]
        assert httpx2.get(server.url + "/health/ready").status_code == 200

        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: httpx2.get(server.url + "/health/ready").status_code == 503, "readiness to turn off")
        assert httpx2.get(server.url + "/health/live").status_code == 200
        with pytest.raises(openai.InternalServerError) as refused:
            client.chat.completions.create(model="relay", messages=messages)
        assert refused.value.status_code == 503 and refused.value.body["code"] == "shutting_down"
        metrics = httpx2.get(server.url + "/metrics").text
        assert "meshlm_draining 1.0" in metrics and "meshlm_requests_in_flight 1.0" in metrics
        assert server.proc.poll() is None  # still running: the stream is in flight

        upstream.release.set()
        rest = [c for c in stream]
        texts += [c.choices[0].delta.content for c in rest if c.choices and c.choices[0].delta.content]
        assert "".join(texts) == "Hello world" and rest[-1].choices[0].finish_reason == "stop"
        assert server.proc.wait(60) == 0, server.log.read_text()[-2000:]
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(30)
    records = [r for r in export(audit) if r["kind"] == "request"]
    assert sorted((r["status"], r["stream"]) for r in records) == [(200, True), (503, False)]
    finished = next(r for r in records if r["status"] == 200)
    assert finished["response"] == "Hello world" and finished["finish_reason"] == "stop"


@pytest.mark.parametrize("drain_timeout, signals", [("0.5", 1), ("600", 2)])
def test_a_request_past_the_drain_timeout_is_cut_off_and_audited(tmp_path, upstream, drain_timeout, signals):
    """The upstream never releases: the drain times out (or a second signal cuts it short)."""
    reg = Registry(tmp_path / "reg.sqlite")
    reg.add_endpoint(upstream.url, "relay", "toy", write_report(tmp_path / "pass.json", True))
    reg.close()
    audit = tmp_path / "audit.sqlite"
    server = start_server(["--registry", str(tmp_path / "reg.sqlite"), "--model", "relay:v1", "--audit", str(audit),
                           "--drain-timeout", drain_timeout], tmp_path / "srv")
    try:
        wait_ready(server, tmp_path / "srv")
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        stream = client.chat.completions.create(model="relay", messages=[{"role": "user", "content": "hi"}],
                                                stream=True)
        chunks = iter(stream)
        while not any(c.delta.content for c in next(chunks).choices):
            pass
        server.proc.send_signal(signal.SIGTERM)
        if signals == 2:
            wait_for(lambda: httpx2.get(server.url + "/health/ready").status_code == 503, "the drain to start")
            server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0, server.log.read_text()[-2000:]
        stream.close()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(30)
    records = [r for r in export(audit) if r["kind"] == "request"]
    assert [(r["status"], r["response"]) for r in records] == [(503, "Hello")]
    assert "cutting off 1 requests" in server.log.read_text()


def test_a_bad_drain_timeout_is_a_one_line_error(tmp_path):
    done = meshlm_in_process("serve", "--registry", str(tmp_path / "reg.sqlite"), "--model", "x:v1",
                             "--drain-timeout", "-1")
    assert done.returncode == 2 and "--drain-timeout -1" in done.stderr and "Traceback" not in done.stderr
    done = meshlm_in_process("serve", "--registry", str(tmp_path / "reg.sqlite"), "--model", "x:v1",
                             "--prefix-cache-mb", "-5")
    assert done.returncode == 2 and "--prefix-cache-mb -5" in done.stderr and "Traceback" not in done.stderr
    done = meshlm_in_process("serve", "--registry", str(tmp_path / "reg.sqlite"), "--model", "x:v1",
                             "--speculative", "ngram", "--weights", "int8")
    assert done.returncode == 2 and "--weights int8" in done.stderr and "Traceback" not in done.stderr
