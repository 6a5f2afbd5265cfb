"""The core's Session judges each request's audio with the listener model, from the times it hands
the events out, and exports the result: a real Session and real metrics, a scripted stage body and
a fake clock (the stalls are exact, whatever the machine's load)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import gateway.serving.session
from gateway.serving.metrics import GatewayMetrics
from gateway.serving.session import Session
from omnistream.request.generation import AudioEvent, DoneEvent, TextEvent


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Permit:
    def release(self) -> None:
        pass


def _audio(seconds: float, rate: int = 24_000) -> AudioEvent:
    return AudioEvent(np.zeros(round(seconds * rate), np.float32), 0, rate)


def _scripted(events: list):
    """A stage body that emits `events` and ends with the last (a DoneEvent)."""

    async def body(emit):
        for event in events[:-1]:
            await emit(event)
        return events[-1]

    return body


async def _play(
    monkeypatch,
    timeline: list[tuple[float, object]],
    permit=None,
    guard: tuple[float, float] | None = None,
    after_each=None,
) -> tuple[Session, GatewayMetrics]:
    """Hand out the events of `timeline` at its times, as a client reading them would be; `guard`:
    (first chunk seconds, start guard seconds); `after_each()` runs after every event handed out."""
    clock = Clock()
    monkeypatch.setattr(gateway.serving.session.time, "perf_counter", clock)
    body = _scripted([event for _, event in timeline])
    metrics = GatewayMetrics()
    loop = asyncio.get_running_loop()
    permit = permit or Permit()
    session = Session(metrics, lambda _: None, "r", permit, [], body, loop.time() + 30, *(guard or ()))  # type: ignore[arg-type]
    metrics.in_flight.inc()
    session.start()
    for at, _ in timeline:
        clock.now = at
        await session.next_event()
        if after_each is not None:
            after_each()
    await session.aclose()
    return session, metrics


def _done() -> DoneEvent:
    return DoneEvent([1], [2], "stop", 0, 0, None, None, 0.0)


def _sample(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_a_stall_after_the_first_chunk_is_measured_and_exported(monkeypatch):
    # 0.16 s of audio handed out at 1.0 ends at 1.16; the next comes at 1.5: a 0.34 s stall.
    session, metrics = await _play(
        monkeypatch,
        [
            (0.5, TextEvent([1], "a")),
            (1.0, _audio(0.16)),
            (1.5, _audio(1.0)),
            (1.8, _audio(1.0)),
            (3.0, _done()),
        ],
    )
    heard = session.listening()
    assert heard.stalls == 1 and heard.underrun_s == pytest.approx(0.34)
    assert not heard.continuity_ok
    assert _sample(metrics, "omnistream_audio_underrun_seconds_count") == 1
    assert _sample(metrics, "omnistream_audio_underrun_seconds_sum") == pytest.approx(0.34)
    assert _sample(metrics, "omnistream_audio_underrun_seconds_bucket", le="0.1") == 0
    assert _sample(metrics, "omnistream_audio_underrun_seconds_bucket", le="0.5") == 1
    assert _sample(metrics, "omnistream_audio_stalled_requests_total") == 1
    assert _sample(metrics, "omnistream_audio_stall_seconds_total") == pytest.approx(0.34)


async def test_audio_that_keeps_ahead_of_the_player_keeps_continuity(monkeypatch):
    session, metrics = await _play(
        monkeypatch, [(1.0, _audio(0.5)), (1.3, _audio(0.5, 16_000)), (1.9, _audio(0.5)), (2.0, _done())]
    )
    assert session.listening().stalls == 0 and session.listening().continuity_ok
    assert _sample(metrics, "omnistream_audio_underrun_seconds_bucket", le="0.1") == 1
    assert _sample(metrics, "omnistream_audio_stalled_requests_total") == 0


async def test_a_request_without_audio_is_not_judged(monkeypatch):
    session, metrics = await _play(monkeypatch, [(0.2, TextEvent([1], "a")), (0.4, _done())])
    assert not session.listening().heard
    assert _sample(metrics, "omnistream_audio_underrun_seconds_count") == 0


async def test_a_stream_with_a_short_first_chunk_holds_new_starts_until_it_has_the_guard_in_hand(monkeypatch):
    """The start guard (gateway/admission/permits.py), driven by what the session hands out: 0.16 s first,
    then 0.16 s, 0.32 s, 0.64 s at 0.1 s steps; in hand after each: 0.16, 0.22, 0.44, 0.98, then
    1.0 s of guard reached only with the fifth chunk (1.28 s more at 0.5: 2.16 in hand)."""
    from gateway.admission.permits import Admission

    admission = Admission(16, audio_gate=lambda running, need: True)
    timeline = [
        (0.1, _audio(0.16)),
        (0.2, _audio(0.16)),
        (0.3, _audio(0.32)),
        (0.4, _audio(0.64)),
        (0.5, _audio(1.28)),
        (0.6, _done()),
    ]
    fragile = []
    permit = await admission.acquire(audio=True)
    await _play(monkeypatch, timeline, permit, (0.16, 1.0), lambda: fragile.append(admission.audio_starting))
    assert fragile == [1, 1, 1, 1, 0, 0]
    assert (admission.active, admission.audio_active, admission.audio_starting) == (0, 0, 0)

    # A first chunk of the guard or more is not fragile at all.
    permit = await admission.acquire(audio=True)
    await _play(monkeypatch, timeline, permit, (1.28, 1.0), lambda: fragile.append(admission.audio_starting))
    assert fragile[6:] == [0] * 6


async def test_a_held_session_is_measured_from_its_release_as_its_callers_request(monkeypatch):
    """A speculative request (gateway/realtime/speculation.py) runs before its caller decides: what
    it made while held (its first text, read by `prime`) counts as arriving at the release, and
    its latencies count from there. Its text deltas wait as they were made (not merged)."""
    clock = Clock()
    monkeypatch.setattr(gateway.serving.session.time, "perf_counter", clock)
    body = _scripted([TextEvent([1], "a"), TextEvent([2], "b"), TextEvent([3], "c"), _audio(0.5), _done()])
    metrics = GatewayMetrics()
    loop = asyncio.get_running_loop()
    session = Session(metrics, lambda _: None, "r", Permit(), [], body, loop.time() + 30, held=True)  # type: ignore[arg-type]
    metrics.in_flight.inc()
    session.start()
    clock.now = 0.3
    await session.prime()  # the first text came while held: not measured
    assert _sample(metrics, "omnistream_time_to_first_token_seconds_count") == 0
    clock.now = 0.8
    assert session.release() == pytest.approx(0.8)
    clock.now = 0.85
    handed = [event async for event in session.events()]
    assert [e.delta for e in handed if isinstance(e, TextEvent)] == ["a", "b", "c"]
    t = session.timings
    assert (t.started, t.first_text, t.first_audio) == (0.8, 0.8, 0.85)
    assert _sample(metrics, "omnistream_time_to_first_token_seconds_sum") == pytest.approx(0.0)
    assert _sample(metrics, "omnistream_time_to_first_audio_seconds_sum") == pytest.approx(0.05)


@pytest.mark.parametrize(("made", "fragile_at_release"), [(1.12, 0), (0.48, 1)])
async def test_a_held_stream_is_fragile_only_from_its_release_with_what_it_made_in_hand(
    made, fragile_at_release
):
    """Nothing of a held session plays before its release, so it cannot stall and holds no other
    start back (a held speculation would otherwise hold every start beside it until its decision);
    at the release its listener has all it made in hand: fragile only when that is under the guard,
    until what it is handed reaches it."""
    from gateway.admission.permits import Admission

    admission = Admission(16, audio_gate=lambda running, need: True)
    chunks = [_audio(0.16), _audio(made - 0.16)]
    more = asyncio.Event()

    async def body(emit):
        for chunk in chunks:
            await emit(chunk)
            fragile.append(admission.audio_starting)
        await more.wait()
        await emit(_audio(1.0))
        return _done()

    fragile: list[int] = []
    permit = await admission.acquire(audio=True)
    loop = asyncio.get_running_loop()
    session = Session(
        GatewayMetrics(), lambda _: None, "r", permit, [], body, loop.time() + 30, 0.16, 1.0, held=True
    )  # type: ignore[arg-type]
    session.start()
    await session.prime()
    while len(fragile) < 2:
        await asyncio.sleep(0)
    assert fragile == [0, 0]  # held: never fragile
    session.release()
    assert admission.audio_starting == fragile_at_release
    await session.next_event()
    more.set()
    await session.next_event()  # 1 s more handed out: in hand past the guard whatever was made
    assert admission.audio_starting == 0
    await session.aclose()
    assert (admission.active, admission.audio_active, admission.audio_starting) == (0, 0, 0)
