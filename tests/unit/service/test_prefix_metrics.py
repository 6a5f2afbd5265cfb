"""A stage's prefix cache in Prometheus (omnistream/service/prefix_metrics.py)."""

from __future__ import annotations

import torch
from prometheus_client import CollectorRegistry, generate_latest

from omnistream.engine.prefix_cache import CachedBlock, PrefixCache
from omnistream.service.prefix_metrics import PrefixCacheCollector


def test_queries_hits_evictions_releases_and_bytes_are_exported_per_stage():
    cache = PrefixCache(1 << 20, block_size=4)
    block = CachedBlock(torch.zeros(1, 2, 1, 4, 2))
    keys = cache.digests(list(range(8)), scope=b"session")
    for key in keys:
        cache.store(key, block, b"session")
    cache.count_query(12, 8)
    registry = CollectorRegistry()
    registry.register(PrefixCacheCollector("talker", cache))
    text = generate_latest(registry).decode()
    assert 'omnistream_stage_prefix_cache_queried_tokens_total{stage="talker"} 12.0' in text
    assert 'omnistream_stage_prefix_cache_hit_tokens_total{stage="talker"} 8.0' in text
    assert f'omnistream_stage_prefix_cache_bytes{{stage="talker"}} {float(2 * block.nbytes)}' in text
    cache.request_release(b"session")
    cache.apply_releases()
    text = generate_latest(registry).decode()
    assert 'omnistream_stage_prefix_cache_released_blocks_total{stage="talker"} 2.0' in text
    assert 'omnistream_stage_prefix_cache_bytes{stage="talker"} 0.0' in text
    assert 'omnistream_stage_prefix_cache_budget_bytes{stage="talker"} 1.048576e+06' in text
