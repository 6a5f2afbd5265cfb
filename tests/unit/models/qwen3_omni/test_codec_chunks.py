from __future__ import annotations

import itertools

import pytest

from omnistream.models.qwen3_omni.codec_chunks import (
    ChunkPlan,
    FrameShipper,
    dynamic_initial_frames,
    flush_points,
)
from omnistream.request.errors import InvalidRequest


def test_recompute_windows_follow_the_anchor_example():
    # Recompute baseline, 32 frames, IC 4: (frames, of which context) = (4,0), (29,4), (28,25) + lookahead.
    plan = ChunkPlan(4, 25, 25, "fixed")
    assert plan.span(0, 32, True) == (0, 4, 5, True)
    assert plan.span(4, 32, True) == (0, 29, 30, True)
    assert plan.span(29, 32, True) == (4, 32, 32, False)


def test_recompute_windows_follow_the_growing_schedule():
    # Windows 4, 4, 8, 16, ... each with up to 25 frames of context and one of lookahead.
    plan = ChunkPlan(4, 25, 25, "grow")
    assert plan.span(0, 40, True) == (0, 4, 5, True)
    assert plan.span(4, 40, True) == (0, 8, 9, True)
    assert plan.span(8, 40, True) == (0, 16, 17, True)
    assert plan.span(16, 40, True) == (0, 32, 33, True)
    assert plan.span(32, 40, True) == (7, 40, 40, False)
    assert not plan.ready(4, 8, False) and plan.ready(4, 9, False)


@pytest.mark.parametrize("schedule", ["grow", "fixed"])
def test_recompute_ready_needs_one_frame_of_lookahead_until_the_end(schedule):
    plan = ChunkPlan(4, 25, 25, schedule)
    assert not plan.ready(0, 4, False)
    assert plan.ready(0, 5, False)
    assert plan.ready(0, 4, True)
    assert not plan.ready(4, 4, True)


def test_flush_points_are_window_ends_for_the_exact_stream():
    fixed = ChunkPlan(4, 25, 25, "fixed")
    assert list(itertools.islice(flush_points(fixed), 3)) == [4, 29, 54]
    assert list(itertools.islice(flush_points(fixed, lookahead=1), 3)) == [5, 30, 55]
    grow = ChunkPlan(2, 25, 25, "grow")
    assert list(itertools.islice(flush_points(grow), 7)) == [2, 4, 8, 16, 32, 57, 82]
    assert list(itertools.islice(flush_points(grow, lookahead=1), 4)) == [3, 5, 9, 17]


def test_shipper_ships_each_window_end():
    shipper = FrameShipper(ChunkPlan(2, 3, 0, "fixed"))
    shipped = []
    for frame in range(9):
        shipper.frames.append([frame] * 16)
        if shipper.due(frame == 8):
            first, codes = shipper.take()
            shipped.append((first, codes.shape[1]))
    assert shipped == [(0, 2), (2, 3), (5, 3), (8, 1)]


def _ship(plan: ChunkPlan, total: int, per_step: int, lookahead: int = 0) -> list[tuple[int, int]]:
    """(first frame, frames) of each batch a shipper hands out when `per_step` frames come at a time."""
    shipper = FrameShipper(plan, lookahead=lookahead)
    shipped = []
    for frame in range(total):
        shipper.frames.append([frame] * 16)
        last = frame == total - 1
        if ((frame + 1) % per_step == 0 or last) and shipper.due(last):
            first, codes = shipper.take()
            assert codes[0].tolist() == list(range(first, first + codes.shape[1]))
            shipped.append((first, codes.shape[1]))
    return shipped


def test_shipper_over_the_growing_plan_ships_windows_as_long_as_all_before_them():
    assert _ship(ChunkPlan(2, 25, 0, "grow"), 70, 1) == [
        (0, 2), (2, 2), (4, 4), (8, 8), (16, 16), (32, 25), (57, 13)
    ]  # fmt: skip
    assert _ship(ChunkPlan(2, 25, 0, "grow"), 70, 1, lookahead=1) == [
        (0, 3), (3, 2), (5, 4), (9, 8), (17, 16), (33, 25), (58, 12)
    ]  # fmt: skip
    # Frames arriving several per step: a batch holds whatever is in, never splits a window, and
    # the next due point is the first window end past what was shipped.
    assert _ship(ChunkPlan(2, 25, 0, "grow"), 40, 5) == [(0, 5), (5, 5), (10, 10), (20, 15), (35, 5)]
    assert _ship(ChunkPlan(2, 25, 0, "fixed"), 40, 1) == [(0, 2), (2, 25), (27, 13)]


def test_dynamic_initial_frames_rises_with_load():
    assert [dynamic_initial_frames(a, 10) for a in (0, 3, 5, 10, 20)] == [2, 4, 8, 16, 16]


def test_invalid_plans():
    with pytest.raises(InvalidRequest):
        ChunkPlan(0, 25, 25).validate()
    with pytest.raises(InvalidRequest):
        ChunkPlan(30, 25, 25).validate()
    with pytest.raises(InvalidRequest) as info:
        ChunkPlan(2, 25, 25, "doubling").validate()
    assert info.value.field == "codec_chunk_schedule" and "grow" in str(info.value)
