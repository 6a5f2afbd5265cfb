from __future__ import annotations

import itertools

import pytest

from omnistream.errors import InvalidRequest
from omnistream.qwen3_omni.codec_chunks import ChunkPlan, FrameShipper, dynamic_initial_frames, flush_points


def test_recompute_windows_follow_the_anchor_example():
    # Recompute baseline, 32 frames, IC 4: (frames, of which context) = (4,0), (29,4), (28,25) + lookahead.
    plan = ChunkPlan(4, 25, 25)
    assert plan.span(0, 32, True) == (0, 4, 5, True)
    assert plan.span(4, 32, True) == (0, 29, 30, True)
    assert plan.span(29, 32, True) == (4, 32, 32, False)


def test_recompute_ready_needs_one_frame_of_lookahead_until_the_end():
    plan = ChunkPlan(4, 25, 25)
    assert not plan.ready(0, 4, False)
    assert plan.ready(0, 5, False)
    assert plan.ready(0, 4, True)
    assert not plan.ready(4, 4, True)


def test_flush_points_are_window_ends_for_the_exact_stream():
    assert list(itertools.islice(flush_points(ChunkPlan(4, 25, 25)), 3)) == [4, 29, 54]
    assert list(itertools.islice(flush_points(ChunkPlan(4, 25, 25), lookahead=1), 3)) == [5, 30, 55]


def test_shipper_ships_each_window_end():
    shipper = FrameShipper(ChunkPlan(2, 3, 0))
    shipped = []
    for frame in range(9):
        shipper.frames.append([frame] * 16)
        if shipper.due(frame == 8):
            first, codes = shipper.take()
            shipped.append((first, codes.shape[1]))
    assert shipped == [(0, 2), (2, 3), (5, 3), (8, 1)]


def test_dynamic_initial_frames_rises_with_load():
    assert [dynamic_initial_frames(a, 10) for a in (0, 3, 5, 10, 20)] == [2, 4, 8, 16, 16]


def test_invalid_plans():
    with pytest.raises(InvalidRequest):
        ChunkPlan(0, 25, 25).validate()
    with pytest.raises(InvalidRequest):
        ChunkPlan(30, 25, 25).validate()
