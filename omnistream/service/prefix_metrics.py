"""A stage's prefix cache in Prometheus: tokens looked up and found (vLLM's `prefix_cache_queries` and
`prefix_cache_hits`, under this project's unit-suffixed names), the bytes it holds and its budget.

A collector rather than counters we increment: the engine thread owns the cache's totals, and a
scrape reads them as they are (plain ints, read from the scrape's thread)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from omnistream.engine.prefix_cache import PrefixCache


class PrefixCacheCollector(Collector):
    def __init__(self, stage: str, cache: PrefixCache) -> None:
        self.stage = stage
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        stats, stage = self.cache.stats, [self.stage]
        for name, help_, value in (
            (
                "queried_tokens",
                "Prompt tokens looked up in the prefix cache (vLLM: prefix_cache_queries)",
                stats.queries,
            ),
            ("hit_tokens", "Of those, tokens whose KV was reused (vLLM: prefix_cache_hits)", stats.hits),
            ("evicted_blocks", "Blocks the budget evicted (least recently used first)", stats.evicted_blocks),
            (
                "released_blocks",
                "Blocks dropped because their cache scope ended (a realtime session closed)",
                stats.released_blocks,
            ),
        ):
            counter = CounterMetricFamily(f"omnistream_stage_prefix_cache_{name}", help_, labels=["stage"])
            counter.add_metric(stage, value)
            yield counter
        for name, help_, value in (
            ("bytes", "Bytes of KV (and deep rows) the prefix cache holds", self.cache.cached_bytes),
            (
                "budget_bytes",
                "The prefix cache's budget (serve --prefix-cache-gib; 0: off)",
                self.cache.budget_bytes,
            ),
        ):
            gauge = GaugeMetricFamily(f"omnistream_stage_prefix_cache_{name}", help_, labels=["stage"])
            gauge.add_metric(stage, value)
            yield gauge
