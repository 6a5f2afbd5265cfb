"""Samples that cannot change are checked for NaN and infinity once while they live; any other
array every time."""

from __future__ import annotations

import numpy as np

import omnistream.models.qwen3_omni.thinker.finite_samples as module
from omnistream.models.qwen3_omni.thinker.finite_samples import FiniteSamples


def _counting(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = np.isfinite
    monkeypatch.setattr(module.np, "isfinite", lambda a: calls.append(a.size) or real(a))
    return calls


def test_wire_samples_are_checked_once_and_writable_ones_every_time(monkeypatch):
    checked = FiniteSamples()
    wire = np.frombuffer(
        np.ones(1600, dtype=np.float32).tobytes(), dtype=np.float32
    )  # read-only view of bytes
    writable = np.ones(1600, dtype=np.float32)
    calls = _counting(monkeypatch)
    for _ in range(3):
        assert checked.finite(wire) and checked.finite(writable)
    assert len(calls) == 1 + 3
    writable[5] = np.nan  # a writable array may change: found at once
    assert not checked.finite(writable)


def test_a_read_only_view_of_a_writable_array_is_checked_every_time(monkeypatch):
    checked = FiniteSamples()
    base = np.ones(1600, dtype=np.float32)
    view = base[:]
    view.flags.writeable = False
    calls = _counting(monkeypatch)
    assert checked.finite(view) and checked.finite(view)
    assert len(calls) == 2
    base[0] = np.inf
    assert not checked.finite(view)


def test_samples_with_nan_are_refused_and_never_remembered():
    checked = FiniteSamples()
    bad = np.frombuffer(np.array([0.0, np.nan], dtype=np.float32).tobytes(), dtype=np.float32)
    assert not checked.finite(bad) and not checked.finite(bad)
    assert len(checked) == 0


def test_a_remembered_array_is_forgotten_when_it_goes():
    checked = FiniteSamples()
    wire = np.frombuffer(np.ones(160, dtype=np.float32).tobytes(), dtype=np.float32)
    assert checked.finite(wire) and len(checked) == 1
    del wire
    assert len(checked) == 0
