"""Prometheus metrics of a stage service: unit-suffixed names, explicit buckets, no colons."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

from omnistream.engine.prefix_cache import PrefixCache
from omnistream.service.encoded_window_metrics import EncodedWindowsCollector, TurnFramesCollector
from omnistream.service.prefix_metrics import PrefixCacheCollector

if TYPE_CHECKING:
    from omnistream.engine.api import StageEngine

STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# Seconds of audio a request's listener holds when the stage steps it (omnistream/engine/playout.py). A
# late one (the listener already waits) is observed as 0: bucket le=0 counts them, and the sum
# stays a counter (a histogram with negative buckets would not expose its sum).
BUFFERED_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# A grammar compiles in a millisecond (a small schema) to seconds (a large tool set; the bound is 10 s).
GRAMMAR_COMPILE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class _Streams(Protocol):
    """What `track_streams` reads of its servicer (a StageServicer)."""

    @property
    def engine(self) -> StageEngine: ...

    def orphaned_requests(self) -> int: ...


class StageMetrics:
    def __init__(self, stage: str, engine: StageEngine, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self.stage = stage
        self._add_step_metrics()
        self._add_stream_metrics()
        self._add_scheduling_metrics()
        self._add_engine_metrics(engine)
        self.running.set_function(lambda: engine.counts()[0])
        self.waiting.set_function(lambda: engine.counts()[1])
        engine.add_step_listener(self._on_step)

    def _add_step_metrics(self) -> None:
        """The engine's requests and steps (registered first: the exposition keeps this order)."""
        labels = {"stage": self.stage}
        r = self.registry
        self.running = Gauge(
            "omnistream_stage_running_requests", "Requests the engine is computing", ["stage"], registry=r
        ).labels(**labels)
        self.waiting = Gauge(
            "omnistream_stage_waiting_requests",
            "Requests admitted but waiting (for a batch slot or for input)",
            ["stage"],
            registry=r,
        ).labels(**labels)
        self.streams = Gauge(
            "omnistream_stage_open_streams", "gRPC streams currently open", ["stage"], registry=r
        ).labels(**labels)
        self.batch_size = Histogram(
            "omnistream_stage_batch_size",
            "Requests per batched step",
            ["stage"],
            buckets=BATCH_BUCKETS,
            registry=r,
        ).labels(**labels)
        self.step_seconds = Histogram(
            "omnistream_stage_step_seconds",
            "Wall time of one engine step",
            ["stage"],
            buckets=STEP_BUCKETS,
            registry=r,
        ).labels(**labels)

    def _add_stream_metrics(self) -> None:
        """The streams' chunks, aborts and errors."""
        labels = {"stage": self.stage}
        r = self.registry
        self.chunks_in = Counter(
            "omnistream_stage_chunks_in_total", "Input chunks received", ["stage"], registry=r
        ).labels(**labels)
        self.chunks_out = Counter(
            "omnistream_stage_chunks_out_total", "Output chunks sent", ["stage"], registry=r
        ).labels(**labels)
        self.aborts = Counter(
            "omnistream_stage_aborts_total", "Requests aborted (cancelled or failed)", ["stage"], registry=r
        ).labels(**labels)
        self.errors = Counter(
            "omnistream_stage_errors_total",
            "Requests ended with an error, by kind",
            ["stage", "kind"],
            registry=r,
        )
        self.chunk_cpu = Histogram(
            "omnistream_stage_chunk_cpu_seconds",
            "Thread CPU time spent turning one chunk into engine input (in) or into a message (out)",
            ["stage", "direction"],
            buckets=(1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2),
            registry=r,
        )

    def _add_scheduling_metrics(self) -> None:
        """The audio stages' scheduling under a step budget, and the requests opened."""
        labels = {"stage": self.stage}
        r = self.registry
        self.deferred = Counter(
            "omnistream_stage_deferred_steps_total",
            "Request-steps a ready request waited because the step was full of requests with less "
            "buffered audio (talker, code2wav; always 0 on the thinker)",
            ["stage"],
            registry=r,
        ).labels(**labels)
        self.buffered = Histogram(
            "omnistream_stage_buffered_audio_seconds",
            "Audio its listener still holds (before its first audio: time left to the first-audio "
            "target; 0: dry or late) of each request a step runs (talker, code2wav)",
            ["stage"],
            buckets=BUFFERED_BUCKETS,
            registry=r,
        ).labels(**labels)
        self.requests = Counter(
            "omnistream_stage_requests_total", "Requests opened", ["stage"], registry=r
        ).labels(**labels)

    def _add_engine_metrics(self, engine: StageEngine) -> None:
        """An engine's own metrics beside ours (the vLLM thinker's `vllm:*`), and its prefix cache's."""
        r = self.registry
        for collector in getattr(engine, "metric_collectors", list)():
            r.register(collector)
        grammars = getattr(engine, "grammars", None)
        if grammars is not None:  # the transformers thinker's compiled grammars (engine/grammar.py)
            compile_seconds = Histogram(
                "omnistream_stage_grammar_compile_seconds",
                "Wall time of compiling one output grammar (tool calls, response_format); a grammar "
                "sent again is taken from the cache, not compiled",
                ["stage"],
                buckets=GRAMMAR_COMPILE_BUCKETS,
                registry=r,
            ).labels(stage=self.stage)
            grammars.add_compile_listener(compile_seconds.observe)
        prefix = getattr(engine, "prefix_cache", None)
        if isinstance(prefix, PrefixCache):
            r.register(PrefixCacheCollector(self.stage, prefix))
        windows = getattr(engine, "encoded_windows", None)
        if windows is not None:  # the transformers thinker's (models/qwen3_omni/thinker/encoded_windows.py)
            r.register(EncodedWindowsCollector(self.stage, windows))
        frames = getattr(engine, "turn_frames", None)
        if frames is not None:  # the transformers thinker's (models/qwen3_omni/thinker/turn_frames.py)
            r.register(TurnFramesCollector(self.stage, frames))

    def track_streams(self, servicer: _Streams) -> None:
        """The lifecycle invariant, observable: every engine request has an open stream."""
        Gauge(
            "omnistream_stage_engine_requests",
            "Requests the engine holds (running or waiting)",
            ["stage"],
            registry=self.registry,
        ).labels(stage=self.stage).set_function(lambda: servicer.engine.num_requests)
        Gauge(
            "omnistream_stage_orphaned_requests",
            "Engine requests whose stream has ended (a leak: always 0)",
            ["stage"],
            registry=self.registry,
        ).labels(stage=self.stage).set_function(servicer.orphaned_requests)

    def _on_step(self, engine: StageEngine, seconds: float) -> None:
        self.step_seconds.observe(seconds)
        if engine.stats.last_batch_size:
            self.batch_size.observe(engine.stats.last_batch_size)
        if engine.stats.last_deferred:
            self.deferred.inc(engine.stats.last_deferred)
        for seconds in engine.stats.last_buffered:
            self.buffered.observe(max(0.0, seconds))

    def error(self, kind: str) -> None:
        self.errors.labels(stage=self.stage, kind=kind).inc()
