"""The chunk plan's schedules: where each codec window ends (what both the talker and code2wav
follow), for the growing default and the fixed schedule kept for comparison."""

from __future__ import annotations

import pytest

from omnistream.request.chunk_plan import DEFAULT_SCHEDULE, SCHEDULES, ChunkPlan


def test_the_default_schedule_grows():
    assert DEFAULT_SCHEDULE == "grow" and ChunkPlan().schedule == "grow"
    assert set(SCHEDULES) == {"grow", "fixed"}


@pytest.mark.parametrize(
    ("plan", "lengths"),
    [
        (ChunkPlan(2, 25, 25, "grow"), [2, 2, 4, 8, 16, 25, 25, 25]),
        (ChunkPlan(4, 25, 25, "grow"), [4, 4, 8, 16, 25, 25]),
        (ChunkPlan(16, 25, 25, "grow"), [16, 16, 25, 25]),
        (ChunkPlan(1, 25, 25, "grow"), [1, 1, 2, 4, 8, 16, 25, 25]),
        (ChunkPlan(3, 10, 0, "grow"), [3, 3, 6, 10, 10]),  # capped exactly at chunk, not at a power
        (ChunkPlan(1, 1, 0, "grow"), [1, 1, 1]),
        (ChunkPlan(25, 25, 25, "grow"), [25, 25, 25]),  # initial == chunk: nothing to grow
        (ChunkPlan(2, 25, 25, "fixed"), [2, 25, 25, 25]),
        (ChunkPlan(1, 25, 25, "fixed"), [1, 25, 25]),
        (ChunkPlan(25, 25, 25, "fixed"), [25, 25, 25]),
    ],
)
def test_window_lengths(plan: ChunkPlan, lengths: list[int]) -> None:
    assert plan.validate().window_lengths(len(lengths)) == lengths


def test_an_answer_is_cut_into_the_plans_windows_the_last_one_short():
    assert ChunkPlan(2, 25, 25, "grow").windows(40) == [2, 2, 4, 8, 16, 8]
    assert ChunkPlan(2, 25, 25, "grow").windows(32) == [2, 2, 4, 8, 16]
    assert ChunkPlan(2, 25, 25, "fixed").windows(40) == [2, 25, 13]
    assert ChunkPlan(4, 25, 25, "grow").windows(3) == [3]
    assert ChunkPlan().windows(0) == []


def test_window_end_is_the_end_of_the_window_starting_there():
    plan = ChunkPlan(2, 25, 25, "grow")
    assert [plan.window_end(s) for s in (0, 2, 4, 8, 16, 32, 57)] == [2, 4, 8, 16, 32, 57, 82]
    fixed = ChunkPlan(2, 25, 25, "fixed")
    assert [fixed.window_end(s) for s in (0, 2, 27, 52)] == [2, 27, 52, 77]


def test_a_start_inside_a_window_gets_that_windows_length():
    # No caller starts mid-window; the rule is stated so window_end stays a total function.
    plan = ChunkPlan(2, 25, 25, "grow")
    assert plan.window_end(3) == 3 + 2 and plan.window_end(20) == 20 + 16 and plan.window_end(33) == 58


def test_growing_windows_stay_ahead_of_playback():
    """Each window after the first is as long as all the audio sent before it, until the cap: so a
    pipeline making audio faster than real time (~1.2x with the decoder's trim on the first) has the
    next chunk ready in time, and the audio sent doubles with each window."""
    for initial in range(1, 26):
        plan = ChunkPlan(initial, 25, 25, "grow")
        lengths = plan.window_lengths(12)
        assert lengths[0] == initial
        for i in range(1, len(lengths)):
            assert lengths[i] == min(sum(lengths[:i]), 25)


def test_every_window_end_is_reached_from_zero_in_order():
    # The shipper and the code2wav engine walk start -> window_end(start); the walk never stalls.
    for schedule in SCHEDULES:
        for initial in (1, 2, 3, 7, 25):
            plan = ChunkPlan(initial, 25, 25, schedule)
            start = 0
            for _ in range(50):
                end = plan.window_end(start)
                assert start < end <= start + 25
                start = end
