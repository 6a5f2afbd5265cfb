"""The thinker's audio windows encoded ahead (a realtime turn's, while it was spoken) in Prometheus:
windows kept, and the committed requests' windows found among them or not.

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
