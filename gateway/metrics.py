"""Gateway metrics: client-side latencies as `vllm bench serve` defines them, plus admission."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0)
ITL_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.ttft = Histogram(
            "omnistream_time_to_first_token_seconds",
            "Time to the first text delta",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttfp = Histogram(
            "omnistream_time_to_first_audio_seconds",
            "Time to the first audio chunk",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "omnistream_inter_token_latency_seconds",
            "Gap between text deltas",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "omnistream_e2e_latency_seconds",
            "Request start to its last chunk",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rtf = Histogram(
            "omnistream_real_time_factor",
            "Time to the last audio chunk / audio seconds",
            buckets=RTF_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("omnistream_requests_in_flight", "Admitted requests not yet ended", registry=r)
        self.queued = Gauge("omnistream_requests_queued", "Requests waiting for admission", registry=r)
        self.rejected = Counter(
            "omnistream_requests_rejected_total", "Requests refused, by reason", ["reason"], registry=r
        )
        self.finished = Counter(
            "omnistream_requests_finished_total", "Requests ended, by status", ["status"], registry=r
        )
