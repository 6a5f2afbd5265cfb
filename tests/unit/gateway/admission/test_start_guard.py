"""One stream's start guard on its own: a short first chunk makes the permit fragile; audio in hand
up to the guard, or the timeout, settles it. (Through a real Session: serving/test_session.py.)"""

from __future__ import annotations

import asyncio

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
