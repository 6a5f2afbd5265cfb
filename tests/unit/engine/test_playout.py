"""The playout clock the audio stages schedule by: deadline math and the earliest-deadline order."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from omnistream.engine.playout import Playout, buffered_seconds, by_deadline, check_step_budget


@dataclass
class _State:
    name: str
    arrived: float
    playout: Playout


def _state(name: str, arrived: float, target: float = 0.5, first: float | None = None, out: float = 0.0):
    return _State(name, arrived, Playout(arrived, target, first, out))


def test_before_its_first_audio_a_request_is_due_at_arrival_plus_the_target():
    clock = Playout(arrived=10.0, first_audio_target=0.5)
    assert clock.deadline() == 10.5
    assert clock.buffered(10.2) == pytest.approx(0.3)
    assert clock.buffered(11.0) == pytest.approx(-0.5)  # late: the first audio is overdue


def test_after_its_first_audio_the_listener_runs_dry_at_first_output_plus_audio_out():
    clock = Playout(arrived=10.0, first_audio_target=0.5)
    clock.emitted(0.08, now=12.0)  # the first frame starts the clock, whatever the target said
    assert clock.first_output == 12.0 and clock.deadline() == pytest.approx(12.08)
    for _ in range(24):
        clock.emitted(0.08, now=12.5)  # later output does not move the start
    assert clock.first_output == 12.0
    assert clock.deadline() == pytest.approx(14.0)
    assert clock.buffered(13.0) == pytest.approx(1.0)  # 2 s out, 1 s played: 1 s left


def test_the_least_buffered_goes_first_and_ties_go_by_arrival():
    ahead = _state("ahead", arrived=0.0, first=1.0, out=5.0)  # dry at 6.0
    behind = _state("behind", arrived=0.5, first=1.0, out=0.4)  # dry at 1.4
    new = _state("new", arrived=2.0, target=0.5)  # due at 2.5
    late_tie = _state("late-tie", arrived=1.9, first=2.0, out=0.5)  # dry at 2.5, arrived earlier
    order = by_deadline([ahead, behind, new, late_tie])
    assert [s.name for s in order] == ["behind", "late-tie", "new", "ahead"]
    # Equal deadline and arrival: the given (arrival) order stands.
    twins = [_state("first", 1.0), _state("second", 1.0)]
    assert [s.name for s in by_deadline(twins)] == ["first", "second"]
    assert [s.name for s in by_deadline(twins[::-1])] == ["second", "first"]


def test_buffered_seconds_of_a_step_and_budget_checks():
    states = [_state("a", 0.0, first=1.0, out=2.0), _state("b", 1.0, target=0.25)]
    assert buffered_seconds(states, now=2.0) == pytest.approx((1.0, -0.75))
    check_step_budget("max_step_batch", None)
    check_step_budget("max_step_batch", 1)
    with pytest.raises(ValueError, match="max_step_frames must be at least 1"):
        check_step_budget("max_step_frames", 0)
