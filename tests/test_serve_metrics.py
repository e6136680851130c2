"""The operator's routes: /metrics scraped and parsed with prometheus_client's own parser after real requests
(counters and histograms must move by what the requests did), liveness and readiness, the route table at /v1,
and /metrics without prometheus-client installed (a 404 naming the extra, never a 500).

The server runs in this process (uvicorn on 127.0.0.1, port 0, in a thread) on a random-weight debug checkpoint;
the official openai client talks to it over a real socket."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import httpx2
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.test_serve_fields import serve_tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from serve_tiny(tmp_path_factory, "metrics")


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one /metrics scrape."""
    r = httpx2.get(url + "/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def value(samples: dict, metric: str, **labels) -> float:
    return samples.get((metric, tuple(sorted(labels.items()))), 0.0)


def test_metrics_move_with_real_requests(served):
    client = served.client()
    before = scrape(served.url)
    messages = [{"role": "user", "content": "Say something."}]
    done = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    stream = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=messages, max_tokens=2)
    after = scrape(served.url)

    chat = {"route": "/v1/chat/completions", "version": "tiny:v1", "status": "200"}
    assert value(after, "meshlm_requests_total", **chat) - value(before, "meshlm_requests_total", **chat) == 2
    refused = {"route": "/v1/chat/completions", "version": "-", "status": "404"}
    assert value(after, "meshlm_requests_total", **refused) - value(before, "meshlm_requests_total", **refused) == 1
    generated = done.usage.completion_tokens + stream[-1].usage.completion_tokens
    moved = {name: value(after, name, version="tiny:v1") - value(before, name, version="tiny:v1")
             for name in ("meshlm_generation_tokens_total", "meshlm_prompt_tokens_total",
                          "meshlm_time_to_first_token_seconds_count", "meshlm_time_to_first_token_seconds_sum")}
    assert moved["meshlm_generation_tokens_total"] == generated
    assert moved["meshlm_prompt_tokens_total"] == done.usage.prompt_tokens + stream[-1].usage.prompt_tokens
    assert moved["meshlm_time_to_first_token_seconds_count"] == 2
    assert moved["meshlm_time_to_first_token_seconds_sum"] > 0
    itl = (value(after, "meshlm_inter_token_latency_seconds_count", version="tiny:v1")
           - value(before, "meshlm_inter_token_latency_seconds_count", version="tiny:v1"))
    assert itl == sum(n >= 2 for n in (done.usage.completion_tokens, stream[-1].usage.completion_tokens))
    # The live gauges: read from the engine and the routing table when scraped.
    assert ("meshlm_queue_depth", (("version", "tiny:v1"),)) in after
    assert value(after, "meshlm_engine_batch_rows", version="tiny:v1") == 0  # nothing decoding between requests
    assert value(after, "meshlm_engine_decode_steps_total", version="tiny:v1") > \
        value(before, "meshlm_engine_decode_steps_total", version="tiny:v1")
    assert value(after, "meshlm_rollout_share", name="tiny", version="tiny:v1", role="stable") == 1.0
    assert value(after, "meshlm_requests_in_flight") == 0 and value(after, "meshlm_draining") == 0


def test_liveness_readiness_and_the_route_table(served):
    assert httpx2.get(served.url + "/health/live").json() == {"status": "ok"}
    assert httpx2.get(served.url + "/health").status_code == 200  # the older name still answers
    ready = httpx2.get(served.url + "/health/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    index = httpx2.get(served.url + "/v1").json()
    assert index["base_url"] == served.url + "/v1" and index["models"] == ["tiny"]
    assert {"POST /v1/chat/completions", "GET /metrics", "GET /health/ready"} <= set(index["routes"])


_WITHOUT_PROMETHEUS = textwrap.dedent("""
    import sys, threading, time
    sys.modules["prometheus_client"] = None  # the observability extra is not installed
    import httpx2, uvicorn
    from meshlm.serve.launch import bind
    from meshlm.serve.registry import Registry
    from meshlm.serve.rollout import Router
    from meshlm.serve.server import Server

    class Audit:
        def append(self, record):
            pass

    router = Router(Registry(sys.argv[1]), load=None, user_key="k" * 32)
    server = uvicorn.Server(uvicorn.Config(Server(router, Audit(), None).app, log_level="warning", lifespan="off"))
    sock = bind("127.0.0.1", 0)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    r = httpx2.get(f"http://127.0.0.1:{sock.getsockname()[1]}/metrics")
    print(r.status_code, r.json()["error"]["message"])
    server.should_exit = True
""")


def test_metrics_without_prometheus_client_is_a_404_naming_the_extra(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_PROMETHEUS, str(tmp_path / "reg.sqlite")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("404 ") and "pip install 'meshlm[observability]'" in proc.stdout
