"""Start-up's objects are frozen out of the cycle collector's walks; what comes later is collected."""

from __future__ import annotations

import gc
import weakref

import pytest

from omnistream.service.gc_freeze import freeze_startup_heap


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # the rest of the test session collects as before


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cycle collector frees it


def test_a_full_collection_no_longer_walks_the_startup_heap_and_later_cycles_still_go(unfrozen):
    heap = [{"i": i, "row": [i, str(i)]} for i in range(20_000)]  # a start-up's many objects
    gc.collect()
    assert any(o is heap[0] for o in gc.get_objects(generation=2))  # walked by every full collection
    before_garbage = Node()
    gone_before = weakref.ref(before_garbage)
    del before_garbage
    frozen = freeze_startup_heap()
    assert frozen >= len(heap) and gone_before() is None  # start-up's own garbage went first
    gc.collect()
    assert not any(o is heap[0] for o in gc.get_objects())  # in no generation: never walked again
    later = Node()
    gone_later = weakref.ref(later)
    del later
    gc.collect()
    assert gone_later() is None
