"""The server's Prometheus metrics, in a registry of its own (one per app, so tests can run several).

Definitions (docs/serve.md lists them with docs/metrics.md's τ):
- time to first token: from the request's arrival (queueing included) to its first token's text;
- inter-token latency: the time between two increments of a request's output, divided among the
  tokens of the later one (a speculative step emits several tokens at once);
- τ: tokens emitted per target forward of a request that ran to its end (docs/metrics.md).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
TAU_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("warpdecode_requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.queue_depth = Gauge("warpdecode_queue_depth", "Requests accepted and waiting for the model", registry=r)
        self.batch_size = Gauge("warpdecode_batch_size", "Requests the model is decoding now", registry=r)
        self.step_rows = Histogram("warpdecode_step_rows", "Requests decoded by each batched step (one forward)",
                                   buckets=ROWS_BUCKETS, registry=r)
        self.prompt_tokens = Counter("warpdecode_prompt_tokens", "Prompt tokens of the requests decoded", registry=r)
        self.generated_tokens = Counter("warpdecode_generated_tokens", "Tokens generated", registry=r)
        self.tokens_per_second = Gauge("warpdecode_tokens_per_second",
                                       "Generated tokens per second of the last request that finished", registry=r)
        self.tau = Histogram("warpdecode_tau", "Tokens emitted per target forward, per finished request",
                             buckets=TAU_BUCKETS, registry=r)
        self.ttft = Histogram("warpdecode_time_to_first_token_seconds",
                              "Arrival to first token (queueing included)", buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("warpdecode_inter_token_latency_seconds", "Time between a request's tokens",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.finished = Counter("warpdecode_finished_requests", "Decoded requests, by finish reason",
                                ["reason"], registry=r)

    def text(self) -> bytes:
        return generate_latest(self.registry)
