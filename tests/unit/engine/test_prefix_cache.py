"""The prefix cache's keys, lookups and LRU budget (omnistream/engine/prefix_cache.py)."""

from __future__ import annotations

import pytest
import torch

from omnistream.engine.prefix_cache import CachedBlock, PrefixCache


def _block(fill: float, size: int = 4) -> CachedBlock:
    return CachedBlock(torch.full((2, 2, 1, size, 2), fill, dtype=torch.float32))  # 128 bytes


BLOCK_BYTES = _block(0).nbytes


def _stored(cache: PrefixCache, tokens: list[int]) -> list[bytes]:
    keys = cache.digests(tokens)
    for i in cache.missing(keys):
        cache.store(keys[i], _block(float(i)))
    cache.touch_chain(keys)
    return keys


def test_keys_are_chained_content_digests():
    cache = PrefixCache(1 << 20, block_size=4)
    a = cache.digests([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(a) == 2  # full blocks only
    assert cache.digests([1, 2, 3, 4, 5, 6, 7, 8]) == a
    changed_first = cache.digests([0, 2, 3, 4, 5, 6, 7, 8])
    assert changed_first[0] != a[0] and changed_first[1] != a[1]  # a block's key covers all before it
    assert cache.digests([1, 2, 3, 4, 5, 6, 7, 0])[0] == a[0]
    salted = cache.digests([1, 2, 3, 4, 5, 6, 7, 8], [b"x", b""])
    assert salted[0] != a[0]
    other_model = PrefixCache(1 << 20, block_size=4, namespace=b"other")
    assert other_model.digests([1, 2, 3, 4])[0] != a[0]


def test_match_takes_the_longest_cached_prefix_within_the_limit_and_counts_tokens():
    cache = PrefixCache(1 << 20, block_size=4)
    keys = _stored(cache, list(range(12)))
    assert len(cache.match(keys, limit_tokens=11)) == 2  # the last position is left to compute
    assert len(cache.match(keys, limit_tokens=12)) == 3
    diverging = cache.digests([0, 1, 2, 3, 9, 9, 9, 9, 8, 9, 10, 11])
    assert len(cache.match(diverging, limit_tokens=12)) == 1  # stops at the first miss
    cache.count_query(12, 4)
    assert (cache.stats.queries, cache.stats.hits) == (12, 4)


def test_budget_evicts_least_recent_and_a_chain_from_its_tail():
    cache = PrefixCache(4 * BLOCK_BYTES, block_size=4)
    first = _stored(cache, list(range(12)))  # 3 blocks
    second = _stored(cache, [50 + i for i in range(8)])  # 2 more: one must go
    assert cache.cached_bytes <= 4 * BLOCK_BYTES and len(cache) == 4
    # The oldest chain lost its last block, so what is left of it is still a usable prefix.
    assert len(cache.match(first, limit_tokens=12)) == 2
    assert len(cache.match(second, limit_tokens=8)) == 2
    assert cache.stats.evicted_blocks == 1


def test_a_zero_budget_is_off_and_a_block_over_budget_is_not_kept():
    off = PrefixCache(0, block_size=4)
    keys = _stored(off, list(range(8)))
    assert not off.enabled and len(off) == 0 and off.match(keys, 8) == []
    small = PrefixCache(BLOCK_BYTES - 1, block_size=4)
    _stored(small, list(range(4)))
    assert len(small) == 0 and small.cached_bytes == 0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="block_size"):
        PrefixCache(1, block_size=0)
    with pytest.raises(ValueError, match="budget"):
        PrefixCache(-1)


def test_a_partial_last_block_has_a_key_of_its_own_length():
    cache = PrefixCache(1 << 20, block_size=4)
    keys = _stored(cache, list(range(8)))
    tail = cache.tail_digest(keys[-1], [8, 9])
    assert tail not in (cache.tail_digest(keys[-1], [8]), cache.tail_digest(keys[0], [8, 9]))
    assert cache.tail_digest(None, [0, 1]) != cache.tail_digest(keys[0], [0, 1])  # where it starts counts
    assert cache.get(tail) is None
    cache.store(tail, _block(1.0, size=2))
    assert cache.get(tail) is not None and cache.positions == 10


def _stored_in(cache: PrefixCache, tokens: list[int], scope: bytes) -> list[bytes]:
    keys = cache.digests(tokens, scope=scope)
    for i in cache.missing(keys):
        cache.store(keys[i], _block(float(i)), scope)
    tail = cache.tail_digest(keys[-1], tokens[len(keys) * 4 :], scope=scope)
    cache.store(tail, _block(9.0, size=len(tokens) % 4), scope)
    return keys


def test_a_scope_finds_only_its_own_prefixes_and_ends_with_its_blocks():
    cache = PrefixCache(1 << 20, block_size=4)
    tokens = list(range(10))
    shared = _stored_in(cache, tokens, b"")
    alice = _stored_in(cache, tokens, b"alice-secret")
    assert cache.digests(tokens, scope=b"bob-secret")[0] not in (shared[0], alice[0])  # same content
    assert len(cache.match(cache.digests(tokens, scope=b"bob-secret"), limit_tokens=10)) == 0
    assert cache.tail_digest(None, [1], scope=b"alice-secret") != cache.tail_digest(None, [1])
    assert len(cache.match(alice, limit_tokens=10)) == 2 and len(cache) == 6
    cache.request_release(b"alice-secret")  # any thread; nothing goes before the engine thread applies it
    assert len(cache) == 6
    assert cache.apply_releases() == 3  # its 2 blocks and its partial last one
    assert len(cache.match(alice, limit_tokens=10)) == 0 and len(cache.match(shared, limit_tokens=10)) == 2
    assert cache.cached_bytes == sum(b.nbytes for b in cache._blocks.values())
    assert cache.stats.released_blocks == 3
    cache.request_release(b"never-seen")
    assert cache.apply_releases() == 0


def test_an_evicted_block_leaves_its_scope_and_a_released_scope_keeps_the_budget_exact():
    cache = PrefixCache(3 * BLOCK_BYTES, block_size=4)
    first = cache.digests(list(range(8)), scope=b"s")
    for key in first:
        cache.store(key, _block(1.0), b"s")
    cache.touch_chain(first)
    for key in cache.digests(list(range(50, 58))):  # two shared blocks: one of "s" goes
        cache.store(key, _block(2.0))
    assert len(cache) == 3 and cache.stats.evicted_blocks == 1
    cache.request_release(b"s")
    assert cache.apply_releases() == 1 and cache.cached_bytes == 2 * BLOCK_BYTES


def test_a_released_scope_stores_nothing_more():
    """A request of a session that just ended may still finish (its abort on its way): what it
    would store for the released scope is refused, so nothing of it outlives the release."""
    cache = PrefixCache(1 << 20, block_size=4)
    cache.request_release(b"gone")
    cache.apply_releases()
    key = cache.digests([1, 2, 3, 4], scope=b"gone")[0]
    cache.store(key, _block(1.0), b"gone")
    assert len(cache) == 0
    cache.store(cache.digests([1, 2, 3, 4], scope=b"alive")[0], _block(1.0), b"alive")
    assert len(cache) == 1


def test_lookup_takes_the_whole_blocks_then_the_longest_cached_tail_within_the_limit():
    cache = PrefixCache(1 << 20, block_size=4)
    tokens = list(range(11))  # two whole blocks and a tail of 3
    keys = _stored(cache, tokens)

    def tail(full: int, length: int) -> bytes:
        return cache.tail_digest(keys[full - 1] if full else None, tokens[full * 4 : full * 4 + length])

    cache.store(tail(2, 3), _block(7.0, size=3))
    blocks, reuse = cache.lookup(keys, 11, tail)
    assert reuse == 11 and [b.positions for b in blocks] == [4, 4, 3]
    assert cache.lookup(keys, 10, tail)[1] == 8  # the tail of 3 would pass the limit; none of 2 is cached
    cache.store(tail(2, 2), _block(6.0, size=2))
    assert cache.lookup(keys, 10, tail)[1] == 10
    assert PrefixCache(0, block_size=4).lookup(keys, 11, tail) == ([], 0)


def test_a_chain_goes_on_from_a_known_key_as_if_computed_whole():
    cache = PrefixCache(1 << 20, block_size=4)
    tokens = list(range(14))
    whole = cache.digests(tokens, scope=b"s")
    head = cache.digests(tokens[:8], scope=b"s")
    assert head + cache.digests(tokens[8:], scope=b"s", parent=head[-1]) == whole
