"""The thinker's work ahead on a realtime turn's audio while it was spoken, in Prometheus: encoder
windows kept, and the committed requests' windows found among them or not; log-mel frames kept, and
the committed turns whose features began with them.

A collector, as the prefix cache's (prefix_metrics.py): the engine thread owns the totals, a scrape
reads them as they are."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class WindowTotals(Protocol):
    hits: int
    misses: int
    stored: int

    def __len__(self) -> int: ...


class EncodedWindowsCollector(Collector):
    def __init__(self, stage: str, windows: WindowTotals) -> None:
        self.stage = stage
        self.windows = windows

    def collect(self) -> Iterator[Metric]:
        w, stage = self.windows, [self.stage]
        for name, help_, value in (
            ("stored", "Audio encoder windows encoded ahead of their request and kept", w.stored),
            ("reused", "Windows of requests taken from those kept (not encoded again)", w.hits),
            ("missed", "Windows looked up among those kept and not found (encoded)", w.misses),
        ):
            counter = CounterMetricFamily(f"omnistream_stage_encoded_windows_{name}", help_, labels=["stage"])
            counter.add_metric(stage, value)
            yield counter
        gauge = GaugeMetricFamily(
            "omnistream_stage_encoded_windows", "Audio encoder windows kept now", labels=["stage"]
        )
        gauge.add_metric(stage, len(w))
        yield gauge


class FrameTotals(Protocol):
    kept: int
    reused: int


class TurnFramesCollector(Collector):
    """A turn's log-mel frames kept while it was spoken (models/qwen3_omni/thinker/turn_frames.py)."""

    def __init__(self, stage: str, frames: FrameTotals) -> None:
        self.stage = stage
        self.frames = frames

    def collect(self) -> Iterator[Metric]:
        for name, help_, value in (
            (
                "kept",
                "Turns' audio so far whose log-mel frames were kept (extended) while spoken",
                self.frames.kept,
            ),
            (
                "reused",
                "Committed turns whose features were computed from frames kept while spoken",
                self.frames.reused,
            ),
        ):
            counter = CounterMetricFamily(f"omnistream_stage_turn_frames_{name}", help_, labels=["stage"])
            counter.add_metric([self.stage], value)
            yield counter
