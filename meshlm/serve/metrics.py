"""Prometheus metrics of one server: ``GET /metrics`` in the text exposition format.

Each :class:`Server` owns its own ``CollectorRegistry`` (never prometheus_client's global one), so several servers
in one process, and tests, do not see each other's counts. What a request did is counted once, when its audit
record is written (the same moment for every outcome: served, refused, cut off). What the engines are doing now
(queue depth, batch rows, rollout shares) is read from the router at scrape time, not kept twice.

prometheus-client is an optional dependency (``pip install meshlm[observability]``); without it the server runs
unchanged and ``/metrics`` answers 404 with that hint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    import prometheus_client
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
except ImportError:  # the observability extra is not installed
    prometheus_client = None

INSTALL_HINT = ("/metrics needs prometheus-client: pip install 'meshlm[observability]' (or pip install "
                "prometheus-client) and restart the server")
# Seconds. A CPU decode of a small model takes milliseconds a token; a large prompt's prefill can take seconds.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Metrics:
    """The counters and histograms of one server, and a collector that reads its live state when scraped.

    ``state()`` returns the router's status (``{"deployments": ..., "loaded": ...}``) plus ``in_flight`` and
    ``draining``."""

    def __init__(self, state: Callable[[], dict[str, Any]]) -> None:
        self.available = prometheus_client is not None
        if not self.available:
            return
        pc = prometheus_client
        self.registry = pc.CollectorRegistry(auto_describe=True)
        kw = {"registry": self.registry, "namespace": "meshlm"}
        self.requests = pc.Counter("requests", "Completion requests by route, model version and HTTP status "
                                   "(version '-' when refused before routing)", ["route", "version", "status"], **kw)
        self.ttft = pc.Histogram("time_to_first_token_seconds", "From the request's arrival to its first generated "
                                 "text", ["version"], buckets=TTFT_BUCKETS, **kw)
        self.itl = pc.Histogram("inter_token_latency_seconds", "Per finished one-choice request: the mean time "
                                "between its generated tokens after the first", ["version"], buckets=ITL_BUCKETS, **kw)
        self.duration = pc.Histogram("request_duration_seconds", "From the request's arrival to its audit record",
                                     ["route", "version"], buckets=DURATION_BUCKETS, **kw)
        self.prompt_tokens = pc.Counter("prompt_tokens", "Prompt tokens of finished requests", ["version"], **kw)
        self.generation_tokens = pc.Counter("generation_tokens", "Generated tokens of finished requests (all "
                                            "choices)", ["version"], **kw)
        self.registry.register(_LiveState(state))

    def observe(self, ex) -> None:
        """Count one finished exchange (server.Exchange) when its audit record is written."""
        if not self.available:
            return
        version = ex.version or "-"
        self.requests.labels(ex.path, version, str(ex.status)).inc()
        self.duration.labels(ex.path, version).observe(ex.elapsed())
        if ex.ttft is not None:
            self.ttft.labels(version).observe(ex.ttft)
        if not ex.finished:
            return
        usage = ex.usage()
        self.prompt_tokens.labels(version).inc(usage["prompt_tokens"])
        self.generation_tokens.labels(version).inc(usage["completion_tokens"])
        if ex.n == 1 and ex.ttft is not None and usage["completion_tokens"] >= 2:
            self.itl.labels(version).observe(max(ex.elapsed() - ex.ttft, 0.0) / (usage["completion_tokens"] - 1))

    def exposition(self) -> tuple[bytes, str]:
        """The scrape body and its content type."""
        return prometheus_client.generate_latest(self.registry), prometheus_client.CONTENT_TYPE_LATEST


class _LiveState:
    """Gauges read from the router when scraped: queue depth, batch rows, rollout shares, in-flight, draining."""

    def __init__(self, state: Callable[[], dict[str, Any]]) -> None:
        self._state = state

    def describe(self) -> list:
        return []  # the families are known only when collected (one sample per loaded version)

    def collect(self):
        state = self._state()
        loaded = state.get("loaded", {})
        gauges = {
            "queue_depth": ("Requests waiting for a batch slot on the engine this version runs on", "queued"),
            "engine_batch_rows": ("Sequences in the engine's batch now (the decode batch size)", "active"),
            "engine_mean_batch_rows": ("Mean sequences per decode step since the engine started", "mean_batch"),
        }
        for name, (doc, key) in gauges.items():
            family = GaugeMetricFamily(f"meshlm_{name}", doc, labels=["version"])
            for ref, info in sorted(loaded.items()):
                if isinstance(info.get(key), (int, float)):
                    family.add_metric([ref], float(info[key]))
            yield family
        steps = CounterMetricFamily("meshlm_engine_decode_steps", "Decode steps (model forwards of the whole "
                                    "batch) since the engine started", labels=["version"])
        for ref, info in sorted(loaded.items()):
            if isinstance(info.get("decode_steps"), int):
                steps.add_metric([ref], float(info["decode_steps"]))
        yield steps
        share = GaugeMetricFamily("meshlm_rollout_share", "The share of users routed to each served version of a "
                                  "name (stable: 1 - candidate share)", labels=["name", "version", "role"])
        for name, dep in sorted(state.get("deployments", {}).items()):
            candidate_share = dep["share"] if dep.get("candidate_ref") else 0.0
            share.add_metric([name, dep["stable_ref"], "stable"], 1.0 - candidate_share)
            if dep.get("candidate_ref"):
                share.add_metric([name, dep["candidate_ref"], "candidate"], candidate_share)
        yield share
        yield GaugeMetricFamily("meshlm_requests_in_flight", "Completion requests admitted and not yet finished",
                                value=float(state.get("in_flight", 0)))
        yield GaugeMetricFamily("meshlm_draining", "1 while the server drains for shutdown (new requests get 503)",
                                value=1.0 if state.get("draining") else 0.0)
