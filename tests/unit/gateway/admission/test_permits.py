"""The admission queue (gateway/admission/permits.py): the concurrency bound, the audio hold (a stream
waits while the measured speed could not keep it and the ones playing real time) and the start
guard (new audio starts wait while a fragile stream settles). A fake audio gate; no stage runs."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission.permits import Admission, Permit, Rejected
from gateway.api.openai.errors import error_response


class Gate:
    """A fake audio gate: admits while fewer than `fits` audio streams run (None: unknown, admits)."""

    def __init__(self, fits: int | None) -> None:
        self.fits = fits

    def __call__(self, running: int, need: float | None = None) -> bool:
        return self.fits is None or running < self.fits


async def one_playing_one_held(admission: Admission) -> tuple[Permit, asyncio.Task]:
    """An audio stream admitted, and a second one waiting behind it (the gate fits only one)."""
    playing = await admission.acquire(audio=True)
    held = asyncio.create_task(admission.acquire(audio=True))
    await asyncio.sleep(0.01)
    return playing, held


async def test_ample_headroom_admits_at_once():
    admission = Admission(16, audio_gate=Gate(8))
    permits = [await admission.acquire(audio=True) for _ in range(8)]
    assert admission.audio_active == 8 and admission.active == 8 and admission.audio_held == 0
    for permit in permits:
        permit.release()
    assert admission.audio_active == 0 and admission.active == 0


async def test_no_headroom_holds_then_admits_when_a_stream_ends():
    held: list[tuple[str, str | None]] = []
    admission = Admission(16, audio_gate=Gate(2), on_hold=lambda *why: held.append(why))
    first, second = await admission.acquire(audio=True), await admission.acquire(audio=True)
    third = asyncio.create_task(admission.acquire(audio=True, request_id="r3"))
    fourth = asyncio.create_task(admission.acquire(audio=True, request_id="r4"))
    await asyncio.sleep(0.01)
    # The gate said no to the third; the fourth waits behind it (FIFO), whatever the gate says.
    assert not third.done() and admission.audio_held == 2 and held == [("capacity", "r3"), ("queue", "r4")]
    fourth.cancel()
    await asyncio.gather(fourth, return_exceptions=True)
    assert admission.active == 2  # a held request takes no concurrency slot
    first.release()
    permit = await asyncio.wait_for(third, 1)
    assert permit.audio and admission.audio_active == 2 and admission.audio_held == 0
    second.release()
    permit.release()
    assert (admission.active, admission.audio_active) == (0, 0)


async def test_a_fragile_stream_holds_new_audio_starts_and_lets_them_in_together_when_it_settles():
    admission = Admission(16, audio_gate=Gate(None))
    first = await admission.acquire(audio=True)
    first.mark_starting()
    assert admission.audio_starting == 1
    waves = [asyncio.create_task(admission.acquire(audio=True)) for _ in range(5)]
    await asyncio.sleep(0.01)
    assert admission.audio_held == 5 and not any(w.done() for w in waves)
    text = await asyncio.wait_for(admission.acquire(audio=False), 1)  # text never waits for the guard
    text.release()
    first.settle()
    # All five in at once, each counted in before it resumes: each sizes its first chunk knowing the rest.
    assert admission.audio_active == 6 and admission.audio_held == 0
    permits = [await asyncio.wait_for(w, 1) for w in waves]
    for permit in [first, *permits]:
        permit.release()
    assert (admission.active, admission.audio_active, admission.audio_starting) == (0, 0, 0)


async def test_the_guard_waits_for_every_fragile_stream_and_an_ended_one_counts_as_settled():
    admission = Admission(16, audio_gate=Gate(None))
    a, b = await admission.acquire(audio=True), await admission.acquire(audio=True)
    a.mark_starting()
    b.mark_starting()
    b.mark_starting()  # counted once
    held = asyncio.create_task(admission.acquire(audio=True))
    await asyncio.sleep(0.01)
    a.settle()
    await asyncio.sleep(0.01)
    assert not held.done()  # b is still fragile
    b.release()  # ending settles it
    permit = await asyncio.wait_for(held, 1)
    assert admission.audio_starting == 0
    for p in (a, permit):
        p.release()
    a.settle()  # settling twice or after release changes nothing
    assert (admission.active, admission.audio_active, admission.audio_starting) == (0, 0, 0)


async def test_the_guard_is_part_of_the_audio_hold():
    admission = Admission(16)  # no audio gate: the hold is off, and so is the guard
    first = await admission.acquire(audio=True)
    first.mark_starting()
    second = await asyncio.wait_for(admission.acquire(audio=True), 1)
    for permit in (first, second):
        permit.release()


async def test_a_new_measure_lets_a_held_request_in():
    gate = Gate(1)
    admission = Admission(16, audio_gate=gate)
    playing, held = await one_playing_one_held(admission)
    admission.reconsider()  # nothing changed: still held
    await asyncio.sleep(0.01)
    assert not held.done()
    gate.fits = 2  # the stages report more speed
    admission.reconsider()
    (await asyncio.wait_for(held, 1)).release()
    playing.release()


async def test_text_only_requests_are_never_held_for_audio():
    admission = Admission(4, audio_gate=Gate(1))
    playing, held = await one_playing_one_held(admission)
    text = await asyncio.wait_for(admission.acquire(audio=False), 1)  # passes the held one
    assert not held.done() and admission.active == 2
    text.release()
    playing.release()
    (await asyncio.wait_for(held, 1)).release()


async def test_past_the_hold_bound_and_after_the_timeout_rejected_with_retry_after():
    admission = Admission(16, queue_timeout=0.05, retry_after=3, audio_gate=Gate(1), max_audio_hold=1)
    playing, waiting = await one_playing_one_held(admission)
    with pytest.raises(Rejected) as full:
        await admission.acquire(audio=True)
    assert full.value.reason == "audio_hold_full"
    response = error_response(full.value)
    assert response.status_code == 429 and response.headers["Retry-After"] == "3"
    with pytest.raises(Rejected) as late:
        await waiting
    assert late.value.reason == "audio_hold_timeout" and admission.audio_held == 0
    assert (admission.active, admission.audio_active) == (1, 1)  # nothing leaked
    playing.release()
    refuse = Admission(16, audio_gate=Gate(1), max_audio_hold=0)
    kept = await refuse.acquire(audio=True)
    with pytest.raises(Rejected) as at_once:
        await refuse.acquire(audio=True)
    assert at_once.value.reason == "audio_capacity"
    kept.release()


async def test_a_held_request_that_goes_away_leaves_nothing_behind():
    admission = Admission(16, audio_gate=Gate(1))
    playing, held = await one_playing_one_held(admission)
    held.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held
    playing.release()
    assert (admission.active, admission.audio_active, admission.audio_held) == (0, 0, 0)


async def test_the_concurrency_bound_refuses_at_once_without_an_audio_wait():
    admission = Admission(1, queue_timeout=5, audio_gate=Gate(0))  # no audio room at all...
    text = await admission.acquire()
    with pytest.raises(Rejected) as exc:  # ...but the slots are full: 429 now, as before
        await asyncio.wait_for(admission.acquire(audio=True), 1)
    assert exc.value.reason == "concurrency"
    text.release()


async def test_no_gate_is_todays_admission():
    admission = Admission(2)
    permits = [await admission.acquire(audio=True) for _ in range(2)]
    with pytest.raises(Rejected) as exc:
        await admission.acquire(audio=True)
    assert exc.value.reason == "concurrency"
    for permit in permits:
        permit.release()


class HeadroomGate:
    """A fake audio gate from a headroom curve: `headroom(n)` with n streams (the gate's own rule
    admits anything; only fragile streams' needs hold here)."""

    def __init__(self, headroom) -> None:
        self.headroom = headroom

    def __call__(self, running: int, need: float | None) -> bool:
        return need is None or self.headroom(running + 1) >= need


async def test_new_audio_starts_beside_fragile_streams_while_the_headroom_meets_their_needs():
    admission = Admission(16, audio_gate=HeadroomGate(lambda n: 12.0 / n))
    first = await admission.acquire(audio=True)
    first.need = 3.0  # its first chunk was sized for a headroom of 3
    first.mark_starting()
    second = await asyncio.wait_for(admission.acquire(audio=True), 1)  # 6.0 with it: fits
    second.mark_starting(4.0)
    third = await asyncio.wait_for(admission.acquire(audio=True), 1)  # 4.0 with it: fits
    third.mark_starting(None)  # one whose need is unknown: the guard holds all new starts
    fourth = asyncio.create_task(admission.acquire(audio=True, request_id="r4"))
    await asyncio.sleep(0.01)
    assert not fourth.done() and admission.hold_reason() == "queue"
    third.settle()
    await asyncio.sleep(0.01)
    assert not fourth.done()  # 3.0 with it, and the second needs 4.0
    second.settle()
    permit = await asyncio.wait_for(fourth, 1)  # 3.0 meets the first's 3.0
    for p in (first, second, third, permit):
        p.release()
    assert (admission.active, admission.audio_active, admission.audio_starting) == (0, 0, 0)
