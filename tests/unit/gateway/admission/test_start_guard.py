"""One stream's start guard on its own: a short first chunk makes the permit fragile; audio in hand
up to the guard, or the timeout, settles it. (Through a real Session: serving/test_session.py.)"""

from __future__ import annotations

import asyncio

import pytest

import gateway.admission.start_guard as start_guard
from gateway.admission.permits import Admission
from gateway.admission.start_guard import StartGuard


async def _audio_permit():
    admission = Admission(4, audio_gate=lambda running, need: True)
    return admission, await admission.acquire(audio=True)


async def test_a_short_first_chunk_is_fragile_until_the_guard_is_in_hand():
    admission, permit = await _audio_permit()
    guard = StartGuard(permit, first_chunk_s=0.16, guard_s=1.0)
    assert permit.starting and admission.audio_starting == 1
    guard.on_audio(lambda: 0.5)
    assert permit.starting
    guard.on_audio(lambda: 1.0)
    assert not permit.starting and admission.audio_starting == 0
    guard.cancel()


async def test_a_first_chunk_at_the_guard_or_no_audio_is_never_fragile():
    _, permit = await _audio_permit()
    for first_chunk_s in (1.0, None):
        guard = StartGuard(permit, first_chunk_s, guard_s=1.0)
        assert not permit.starting
        guard.on_audio(lambda: (_ for _ in ()).throw(AssertionError("not asked: nothing to settle")))
        guard.cancel()


async def test_a_stream_that_never_gets_ahead_settles_at_the_timeout(monkeypatch):
    monkeypatch.setattr(start_guard, "START_GUARD_TIMEOUT_S", 0.05)
    _, permit = await _audio_permit()
    StartGuard(permit, first_chunk_s=0.16, guard_s=1.0)
    assert permit.starting
    await asyncio.sleep(0.1)
    assert not permit.starting


async def test_audio_in_hand_lowers_a_fragile_streams_need_until_it_settles():
    admission, permit = await _audio_permit()
    asked = []

    def need_from(delivered: int, in_hand: float) -> float:
        asked.append((delivered, in_hand))
        return 3.5 - in_hand

    permit.need = 3.0
    guard = StartGuard(permit, first_chunk_s=0.16, guard_s=1.0, need_from=need_from)
    guard.on_audio(lambda: 0.0, delivered=1)  # nothing in hand: nothing to go by
    guard.on_audio(lambda: 0.5, delivered=2)  # 3.0: no lower
    assert permit.need == 3.0
    guard.on_audio(lambda: 0.9, delivered=3)
    assert permit.need == pytest.approx(2.6) and permit.starting
    guard.on_audio(lambda: 1.0, delivered=4)  # the guard in hand: settled, need no longer asked
    assert not permit.starting and admission.audio_starting == 0
    assert asked == [(2, 0.5), (3, 0.9)]
    guard.cancel()
