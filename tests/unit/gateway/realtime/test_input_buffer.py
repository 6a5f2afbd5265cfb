"""When the input buffer's audio arrived (input_buffer.py): `arrived_at(sample)` is the arrival of
the append that held the audio just before `sample`, across appends; what is committed, cleared or
dropped before a turn is forgotten with its audio; the record is bounded (the oldest appends go, and
appends within the resolution of one another share the last one's arrival)."""

from __future__ import annotations

import pytest

from gateway.realtime.input_buffer import ARRIVAL_RESOLUTION_S, InputBuffer


def samples(n: int) -> bytes:
    return bytes(2 * n)


def filled(*appends: tuple[int, float]) -> InputBuffer:
    """A buffer of these appends: (samples, arrival)."""
    buffer = InputBuffer(10**6)
    for n, at in appends:
        assert buffer.append(samples(n), at)
    return buffer


def test_a_sample_arrived_with_the_append_that_held_the_audio_before_it():
    buffer = filled((100, 1.0), (100, 2.0), (50, 3.0))
    assert [buffer.arrived_at(s) for s in (1, 99, 100)] == [1.0, 1.0, 1.0]  # 0..99: the first append
    assert [buffer.arrived_at(s) for s in (101, 200)] == [2.0, 2.0]
    assert [buffer.arrived_at(s) for s in (201, 250)] == [3.0, 3.0]
    assert buffer.arrived_at(buffer.end) == 3.0  # a commit's end of speech: its last append
    assert buffer.arrived_at(0) is None  # no audio before the buffer's start
    assert buffer.arrived_at(251) is None  # not arrived yet


def test_committed_and_cleared_audio_is_forgotten_with_its_arrivals():
    buffer = filled((100, 1.0), (100, 2.0), (100, 3.0))
    buffer.take(150)  # a VAD turn ending mid-append: that append's arrival stays for what is left
    assert buffer.start == 150 and buffer.arrived_at(150) is None
    assert buffer.arrived_at(151) == 2.0 and buffer.arrived_at(300) == 3.0
    buffer.keep_from(220)  # silence before a turn, dropped
    assert buffer.arrived_at(220) is None and buffer.arrived_at(221) == 3.0
    buffer.clear()
    assert buffer.arrived_at(buffer.end) is None
    buffer.append(samples(100), 4.0)  # the stream goes on after the cleared audio
    assert buffer.start == 300 and buffer.arrived_at(301) == 4.0 and buffer.arrived_at(400) == 4.0
    buffer.take()
    assert buffer.arrived_at(buffer.end) is None


def test_the_record_is_bounded_and_forgets_the_oldest_appends_first():
    buffer = InputBuffer(10**6, max_arrivals=4)
    for i in range(10):
        buffer.append(samples(10), float(i))
    assert len(buffer._arrivals) == 4
    assert buffer.arrived_at(60) is None  # in an append forgotten
    assert [buffer.arrived_at(s) for s in (61, 70, 71, 100)] == [6.0, 6.0, 7.0, 9.0]


def test_appends_within_the_resolution_share_the_last_ones_arrival_a_few_ms_late_at_most():
    buffer = InputBuffer(10**6)
    for i in range(1000):  # a client of 1-sample appends in a burst: one arrival, not a thousand
        buffer.append(samples(1), 1.0 + i * 1e-6)
    buffer.append(samples(10), 2.0)
    assert len(buffer._arrivals) == 2
    assert buffer.arrived_at(1) == pytest.approx(1.0 + 999e-6)
    assert buffer.arrived_at(1010) == 2.0
    # A steady stream of them: one arrival per resolution, each at most that late.
    steady = InputBuffer(10**6)
    times = [3.0 + i * ARRIVAL_RESOLUTION_S / 4 for i in range(40)]
    for at in times:
        steady.append(samples(1), at)
    assert len(steady._arrivals) <= 10  # 40 appends over 0.1 s
    late = [steady.arrived_at(s + 1) - at for s, at in enumerate(times)]  # type: ignore[operator]
    assert min(late) == 0.0 and max(late) < ARRIVAL_RESOLUTION_S


def test_an_append_refused_as_too_much_leaves_no_arrival():
    buffer = InputBuffer(400)
    assert buffer.append(samples(150), 1.0)
    assert not buffer.append(samples(100), 2.0)
    assert buffer.arrived_at(150) == 1.0 and buffer.arrived_at(151) is None
