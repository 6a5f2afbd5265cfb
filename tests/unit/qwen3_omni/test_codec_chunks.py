from __future__ import annotations

import itertools

import pytest

from omnistream.errors import InvalidRequest
from omnistream.qwen3_omni.codec_chunks import ChunkPlan, dynamic_initial_frames, flush_points


def test_windows_follow_the_anchor_example():
    # 32 frames, IC 4: decode windows (frames, of which context) = (4,0), (29,4), (28,25) + lookahead.
    plan = ChunkPlan(4, 25, 25)
    assert plan.span(0, 32, True) == (0, 4, 5, True)
    assert plan.span(4, 32, True) == (0, 29, 30, True)
    assert plan.span(29, 32, True) == (4, 32, 32, False)


def test_ready_needs_one_frame_of_lookahead_until_the_end():
    plan = ChunkPlan(4, 25, 25)
    assert not plan.ready(0, 4, False)
    assert plan.ready(0, 5, False)
    assert plan.ready(0, 4, True)
    assert not plan.ready(4, 4, True)


def test_flush_points():
    assert list(itertools.islice(flush_points(ChunkPlan(4, 25, 25)), 3)) == [5, 30, 55]


def test_dynamic_initial_frames_rises_with_load():
    assert [dynamic_initial_frames(a, 10) for a in (0, 3, 5, 10, 20)] == [2, 4, 8, 16, 16]


def test_invalid_plans():
    with pytest.raises(InvalidRequest):
        ChunkPlan(0, 25, 25).validate()
    with pytest.raises(InvalidRequest):
        ChunkPlan(30, 25, 25).validate()
