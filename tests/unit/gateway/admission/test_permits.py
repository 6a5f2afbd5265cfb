"""The admission queue (gateway/admission/permits.py): the concurrency bound (by default what the
stages report they hold, gateway/admission/limits.py; an operator's cap wins), the audio hold (a
stream waits while the measured speed could not keep it and the ones playing real time) and the
start guard (new audio starts wait while a fragile stream settles). A fake audio gate and fake
stage room; no stage runs."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission.limits import QUEUE_FLOOR, Room
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
    admission = Admission(1, max_queue=0, queue_timeout=5, audio_gate=Gate(0))  # no audio room at all...
    text = await admission.acquire()
    with pytest.raises(Rejected) as exc:  # ...but the slots are full: 429 now, as before
        await asyncio.wait_for(admission.acquire(audio=True), 1)
    assert exc.value.reason == "concurrency"
    text.release()


async def test_no_gate_is_todays_admission():
    admission = Admission(2, max_queue=0)
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


class Stages:
    """What the stages' replicas in rotation hold, as a health round last read it (admission asks
    at every decision); `audio`: the talkers' and code2wavs' room (default: as the thinkers')."""

    def __init__(self, requests: int, audio: int | None = None) -> None:
        self.room = Room(requests, requests if audio is None else audio)

    def __call__(self) -> Room:
        return self.room


async def admitted_now(admission: Admission, audio: bool = False) -> Permit:
    """A permit that must come without waiting."""
    return await asyncio.wait_for(admission.acquire(audio=audio), 0.5)


async def test_by_default_a_17th_request_is_admitted_while_the_stages_report_room():
    admission = Admission(room=Stages(64))  # e.g. one thinker at --max-batch 16: 64 requests
    permits = [await admitted_now(admission, audio=i % 2 == 0) for i in range(17)]
    assert admission.active == 17 and admission.waiting == 0
    more = [await admitted_now(admission) for _ in range(64 - 17)]  # every one the stages hold
    assert admission.active == 64
    for permit in permits + more:
        permit.release()
    assert (admission.active, admission.audio_active) == (0, 0)


async def test_when_the_stages_are_full_a_request_waits_in_the_queue_and_gets_in_when_one_ends():
    admission = Admission(room=Stages(2))
    first, second = await admitted_now(admission), await admitted_now(admission)
    third = asyncio.create_task(admission.acquire())
    await asyncio.sleep(0.01)
    assert not third.done() and admission.waiting == 1  # waits, not refused
    first.release()
    permit = await asyncio.wait_for(third, 1)  # the freed slot went to it
    assert admission.active == 2 and admission.waiting == 0
    for p in (second, permit):
        p.release()


async def test_past_the_derived_queue_bound_or_its_timeout_429_with_retry_after():
    admission = Admission(queue_timeout=0.2, retry_after=3, room=Stages(2))
    running = [await admitted_now(admission) for _ in range(2)]
    # The queue holds as many as may run, at least QUEUE_FLOOR: here the floor.
    assert admission.limits().queue == QUEUE_FLOOR
    queued = [asyncio.create_task(admission.acquire()) for _ in range(QUEUE_FLOOR)]
    await asyncio.sleep(0.01)
    assert admission.waiting == QUEUE_FLOOR and not any(q.done() for q in queued)
    with pytest.raises(Rejected) as full:
        await admitted_now(admission)
    assert full.value.reason == "queue_full"
    response = error_response(full.value)
    assert response.status_code == 429 and response.headers["Retry-After"] == "3"
    late = await asyncio.gather(*queued, return_exceptions=True)
    assert all(isinstance(r, Rejected) and r.reason == "queue_timeout" for r in late)
    assert error_response(late[0]).headers["Retry-After"] == "3"
    assert (admission.active, admission.waiting) == (2, 0)  # nothing leaked
    for permit in running:
        permit.release()


async def test_the_derived_queue_is_as_large_as_the_room_so_a_burst_of_twice_it_waits():
    admission = Admission(queue_timeout=5, room=Stages(32))
    burst = [asyncio.create_task(admission.acquire()) for _ in range(64)]
    await asyncio.sleep(0.01)
    assert (admission.active, admission.waiting) == (32, 32)
    done = [task for task in burst if task.done()]
    for task in done:
        task.result().release()  # the first half ends: the second half gets in
    assert (admission.active, admission.waiting) == (32, 0)
    for task in burst:
        if task not in done:
            (await asyncio.wait_for(task, 1)).release()
    assert admission.active == 0


async def test_room_a_health_round_brings_lets_the_waiting_in_and_lost_room_admits_no_one():
    stages = Stages(0)  # no thinker has reported yet (or the only one just left the rotation)
    admission = Admission(room=stages)
    waiting = [asyncio.create_task(admission.acquire()) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert admission.waiting == 3  # within queue_timeout, for a replica: not refused
    stages.room = Room(2, 2)
    admission.reconsider()  # the health round that read the new replica's Info
    assert admission.active == 2 and admission.waiting == 1
    stages.room = Room(1, 1)  # a replica left: the limit shrank below what runs
    permit = await asyncio.wait_for(waiting[0], 1)
    permit.release()
    await asyncio.sleep(0.01)
    assert admission.active == 1 and admission.waiting == 1  # still at the new limit: none let in
    (await asyncio.wait_for(waiting[1], 1)).release()
    (await asyncio.wait_for(waiting[2], 1)).release()
    assert (admission.active, admission.waiting) == (0, 0)


async def test_an_operators_caps_win_over_the_stages_room():
    capped = Admission(16, max_queue=0, room=Stages(64))  # stages that take 64: the cap says 16
    permits = [await admitted_now(capped) for _ in range(16)]
    with pytest.raises(Rejected) as refused:
        await admitted_now(capped)
    assert refused.value.reason == "concurrency"
    for permit in permits:
        permit.release()
    generous = Admission(4, max_queue=1, room=Stages(1, audio=0))  # above the room, audio included
    permits = [await admitted_now(generous, audio=True) for _ in range(4)]
    assert generous.limits().queue == 1
    for permit in permits:
        permit.release()
    assert Admission(8, room=Stages(64)).limits().queue == 8  # the queue follows the cap


async def test_text_only_requests_take_the_thinkers_room_whatever_the_audio_stages_hold():
    held: list[tuple[str, str | None]] = []
    admission = Admission(
        room=Stages(8, audio=1), audio_gate=Gate(None), on_hold=lambda *why: held.append(why)
    )
    playing = await admitted_now(admission, audio=True)  # the talkers' only room
    second = asyncio.create_task(admission.acquire(audio=True, request_id="a2"))
    await asyncio.sleep(0.01)
    assert not second.done() and held == [("room", "a2")]  # waits in the audio hold, slotless
    texts = [await admitted_now(admission) for _ in range(7)]  # the thinkers' other 7
    assert admission.active == 8 and not second.done()
    texts.pop().release()
    playing.release()  # the talker's room is free again: the held one gets in
    (await asyncio.wait_for(second, 1)).release()
    for permit in texts:
        permit.release()
    assert (admission.active, admission.audio_active, admission.audio_held) == (0, 0, 0)


async def test_admission_needs_a_cap_or_the_stages_room():
    with pytest.raises(ValueError, match="max_concurrency or the stages' room"):
        Admission()
    with pytest.raises(ValueError, match="at least 1"):
        Admission(0)
