"""HeapTrimmer: trims when a step leaves the engine idle (at most once a second) or every `interval`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from omnistream.service import heap_trim
from omnistream.service.heap_trim import HeapTrimmer


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(heap_trim.time, "monotonic", lambda: now[0])
    return now


def test_trims_after_an_idle_step_at_most_once_a_second(clock):
    trimmer = HeapTrimmer(interval=60)
    assert trimmer.enabled  # glibc here
    idle, busy = SimpleNamespace(num_requests=0), SimpleNamespace(num_requests=3)
    clock[0] += 0.5
    trimmer(idle, 0.01)
    assert trimmer.trims == 0  # too soon after the last
    clock[0] += 1.0
    trimmer(busy, 0.01)
    assert trimmer.trims == 0  # busy and within the interval
    trimmer(idle, 0.01)
    assert trimmer.trims == 1
    clock[0] += 61
    trimmer(busy, 0.01)
    assert trimmer.trims == 2  # busy for longer than the interval


def test_zero_interval_turns_it_off(monkeypatch):
    monkeypatch.setenv(heap_trim.INTERVAL_ENV, "0")
    trimmer = HeapTrimmer()
    trimmer(SimpleNamespace(num_requests=0), 0.01)
    assert not trimmer.enabled and trimmer.trims == 0
