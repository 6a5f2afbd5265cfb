"""The capturable-region marker: nested, per thread, restored on errors."""

from __future__ import annotations

import threading

import pytest

from omnistream.engine.capture import capturable, inside


def test_marker_nests_and_restores():
    assert not inside()
    with capturable("outer"):
        assert inside()
        with capturable("inner"):
            assert inside()
        assert inside()
    assert not inside()


def test_marker_is_restored_when_the_body_raises():
    with pytest.raises(RuntimeError), capturable("failing"):
        raise RuntimeError("boom")
    assert not inside()


def test_marker_is_per_thread():
    seen = []
    with capturable("this thread"):
        other = threading.Thread(target=lambda: seen.append(inside()))
        other.start()
        other.join()
    assert seen == [False]
