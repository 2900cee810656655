"""The server's Prometheus metrics (prometheus-client, a registry of its own): request latency,
queue wait, real and padded batch sizes, requests by status code, queue depth, compiled sizes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServeMetrics:
    def __init__(self, sizes: list[int]):
        self.registry = registry = CollectorRegistry()
        buckets = [float(s) for s in sizes]
        self.latency = Histogram("triskele_request_seconds", "Infer requests' time from arrival to answer",
                                 buckets=SECONDS, registry=registry)
        self.queue_wait = Histogram("triskele_queue_wait_seconds", "Time a request waits in the queue before its "
                                    "first batch", buckets=SECONDS, registry=registry)
        self.batch = Histogram("triskele_batch_rows", "Real records per model call", buckets=buckets,
                               registry=registry)
        self.padded = Histogram("triskele_batch_padded_rows", "Compiled batch size of each model call (real rows "
                                "plus padding)", buckets=buckets, registry=registry)
        self.requests = Counter("triskele_requests", "HTTP requests answered, by route and status code",
                                ["route", "code"], registry=registry)
        self.queue_depth = Gauge("triskele_queue_depth", "Requests waiting in the queue", registry=registry)
        self.compiled = Gauge("triskele_compiled_batch_size", "Batch sizes compiled and warmed (1 each)", ["size"],
                              registry=registry)
        self.ready = Gauge("triskele_ready", "1 once every batch size is warmed, 0 while warming or draining",
                           registry=registry)

    def observe(self, event: str, value: float) -> None:
        """The batcher's events (`triskele.eval.serving.batcher.Batcher`)."""
        {"queue_wait": self.queue_wait.observe, "batch": self.batch.observe, "padded": self.padded.observe,
         "queue_depth": self.queue_depth.set}[event](value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
