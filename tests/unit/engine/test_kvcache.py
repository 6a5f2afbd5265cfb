"""SlotKVCache: rows of different lengths write at their own positions and see only their keys."""

from __future__ import annotations

import pytest
import torch

from omnistream.engine.kvcache import SlotKVCache


def _cache() -> SlotKVCache:
    return SlotKVCache(num_layers=2, num_kv_heads=2, head_dim=4, slots=3, capacity=16, dtype=torch.float32)


def _fill(cache: SlotKVCache, slot: int, n: int, value: float) -> None:
    cache.plan([slot], n)
    for layer in range(cache.num_layers):
        k = torch.full((1, 2, n, 4), value)
        cache.update(k, -k, layer)
    cache.commit()


def test_rows_write_at_their_own_positions_and_the_mask_hides_padding():
    cache = _cache()
    a, b = cache.allocate(), cache.allocate()
    _fill(cache, a, 5, 1.0)
    _fill(cache, b, 2, 2.0)
    for q in (1, 3):  # decode, and a multi-position step of two rows
        starts = [cache.lengths[b], cache.lengths[a]]
        cache.plan([b, a], q)  # batch order is not slot order
        assert cache.positions().tolist() == [[s + j for j in range(q)] for s in starts]
        keys = torch.arange(2 * 2 * q * 4, dtype=torch.float32).view(2, 2, q, 4) + 100 * q
        k, v = cache.update(keys, -keys, 1)
        end = max(starts) + q
        assert k.shape == (2, 2, end, 4)
        for row, start in enumerate(starts):
            assert torch.equal(k[row, :, start : start + q], keys[row])
            assert torch.equal(v[row, :, start : start + q], -keys[row])
        mask = cache.attention_mask()
        assert mask.shape == (2, 1, q, end) and mask.dtype == torch.float32
        for row, start in enumerate(starts):
            for j in range(q):
                assert mask[row, 0, j].tolist() == [
                    0.0 if i <= start + j else float("-inf") for i in range(end)
                ]
        cache.commit()
        assert [cache.lengths[b], cache.lengths[a]] == [s + q for s in starts]
    # Layer 1's earlier keys of slot a are still there, untouched by the batched writes.
    assert torch.equal(cache.keys[1][a, :, :5], torch.full((2, 5, 4), 1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_additive_mask_attends_exactly_as_the_boolean_one(dtype):
    """SDPA with the step's additive mask gives the very bits it gives with the boolean mask it replaces."""
    cache = SlotKVCache(num_layers=1, num_kv_heads=4, head_dim=16, slots=2, capacity=64, dtype=dtype)
    a, b = cache.allocate(), cache.allocate()
    for slot, n in ((a, 30), (b, 7)):  # rows of different lengths: a batch with padding
        cache.plan([slot], n)
        cache.commit()
    cache.plan([a, b], 5)
    mask = cache.attention_mask()
    assert mask.dtype == dtype
    q, k, v = (torch.randn(2, 4, n, 16, dtype=dtype) for n in (5, 35, 35))
    boolean = mask == 0
    torch.testing.assert_close(
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=boolean),
        rtol=0,
        atol=0,
    )


def test_a_single_row_matches_the_batched_path():
    one, two = _cache(), _cache()
    for cache in (one, two):
        cache.allocate()
        cache.allocate()
        _fill(cache, 0, 3, 1.0)
        _fill(cache, 1, 3, 1.0)
    keys = torch.randn(1, 2, 1, 4)
    one.plan([0], 1)
    k1, _ = one.update(keys, keys, 0)
    two.plan([0, 1], 1)
    k2, _ = two.update(torch.cat([keys, keys]), torch.cat([keys, keys]), 0)
    assert torch.equal(k1[0], k2[0])


def test_update_syncs_nothing(monkeypatch):
    """Per layer: no value crosses to the host and no tensor is made from host data."""
    cache = _cache()
    for slot in (cache.allocate(), cache.allocate()):
        _fill(cache, slot, 2 + slot, 1.0)
    cache.plan([0, 1], 1)
    calls = []
    for name in ("item", "tolist", "__int__", "__bool__", "__index__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda *a, _n=name, _o=original, **k: calls.append(_n) or _o(*a, **k)
        )
    for name in ("tensor", "as_tensor", "arange"):
        original = getattr(torch, name)
        monkeypatch.setattr(
            torch, name, lambda *a, _n=name, _o=original, **k: calls.append(_n) or _o(*a, **k)
        )
    for layer in range(cache.num_layers):
        cache.update(torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 4), layer)
    cache.attention_mask()
    cache.positions()
    cache.commit()
    monkeypatch.undo()
    assert calls == []


def test_a_read_prefix_loads_into_a_fresh_slot_as_it_was_computed():
    cache = _cache()
    a = cache.allocate()
    _fill(cache, a, 6, 3.0)
    rows = cache.read(a, 0, 4)
    assert rows.shape == (2, 2, 2, 4, 4)  # layers, key/value, heads, positions, head dim
    cache.release(a)
    b = cache.allocate()
    cache.load(b, rows)
    assert cache.lengths[b] == 4
    for layer in range(cache.num_layers):
        assert torch.equal(cache.keys[layer][b, :, :4], torch.full((2, 4, 4), 3.0))
        assert torch.equal(cache.values[layer][b, :, :4], torch.full((2, 4, 4), -3.0))
    _fill(cache, b, 1, 5.0)  # the next position goes after the loaded prefix
    assert cache.lengths[b] == 5 and torch.equal(cache.keys[0][b, :, 4], torch.full((2, 4), 5.0))


def test_only_computed_positions_are_read_and_only_fresh_slots_loaded():
    cache = _cache()
    a = cache.allocate()
    _fill(cache, a, 3, 1.0)
    with pytest.raises(ValueError, match="not all computed"):
        cache.read(a, 0, 4)
    with pytest.raises(ValueError, match="not fresh"):
        cache.load(a, cache.read(a, 0, 2))
