"""Prometheus metrics of one server (own registry, so several servers can live in one process).

Names follow Prometheus conventions (base units, ``_total`` counters). The queue-depth gauge is
what the Kubernetes autoscaler scales on (see k8s.py)."""

from __future__ import annotations

PREFIX = "tensorpilot_serve"
# latency buckets in seconds: 0.5 ms .. 10 s, roughly x2 apart
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
OUTCOMES = {200: "ok", 400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "bad_request",
            408: "body_timeout", 413: "too_large", 422: "bad_request", 503: "overloaded",
            504: "deadline_exceeded"}


class Metrics:
    def __init__(self, max_batch_size: int):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "Inference and generate requests by outcome.",
                                ["route", "outcome"], registry=r)
        self.queue_time = Histogram(f"{PREFIX}_queue_seconds", "Time from enqueue to batch start.",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.compute_time = Histogram(f"{PREFIX}_compute_seconds", "Forward time of one batch.",
                                      buckets=LATENCY_BUCKETS, registry=r)
        sizes = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, max_batch_size})
        self.batch_size = Histogram(f"{PREFIX}_batch_size", "Rows per executed batch.",
                                    buckets=[s for s in sizes if s <= max_batch_size], registry=r)
        self.queue_depth = Gauge(f"{PREFIX}_queue_depth", "Requests waiting for a batch.", registry=r)
        self.ready = Gauge(f"{PREFIX}_ready", "1 while ready: warmed up and not shutting down.", registry=r)

    def count(self, route: str, status: int) -> None:
        outcome = OUTCOMES.get(status, "error" if status >= 500 else "bad_request")
        self.requests.labels(route, outcome).inc()

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
