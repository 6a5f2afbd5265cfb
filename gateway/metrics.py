"""Gateway metrics: client-side latencies as `vllm bench serve` defines them, plus admission."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from omnistream.listener import Listening

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0)
ITL_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)
# 0.1 is the listener's continuity threshold: the le="0.1" bucket counts the requests that kept
# continuity, _count all those with audio.
UNDERRUN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


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
        # The listener model (omnistream/listener.py) over each completed request's audio, as sent.
        self.underrun = Histogram(
            "omnistream_audio_underrun_seconds",
            "Per request with audio: its underrun, the time a real-time player started at the first "
            "chunk waits for audio (vLLM-Omni's audio_underrun); <= 0.1 s keeps continuity",
            buckets=UNDERRUN_BUCKETS,
            registry=r,
        )
        self.stalled = Counter(
            "omnistream_audio_stalled_requests_total",
            "Requests whose player ran out of audio at least once before the last chunk",
            registry=r,
        )
        self.stall_seconds = Counter(
            "omnistream_audio_stall_seconds_total",
            "Seconds players waited with an empty buffer, over all requests",
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

    def observe_listening(self, heard: Listening) -> None:
        """One completed request's listener result."""
        self.underrun.observe(heard.underrun_s)
        self.stall_seconds.inc(heard.stall_s)
        if heard.stalls:
            self.stalled.inc()
