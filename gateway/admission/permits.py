"""Admission: a bound on concurrent streams plus a bounded, timed wait queue, and the audio hold in
front of it.

The permit lives as long as the stream (released when the response ends, however it ends), so the
bound counts what really occupies the stages, not how fast requests arrive. The bounds are live:
by default what the stages' replicas in rotation report they hold, else the operator's caps
(gateway/admission/limits.py); a health round that brings more room lets in what waits
(`reconsider`), and a bound that shrank lets no one in until enough permits ended.

Audio hold: a request with audio first asks the audio gate whether one more stream can start
without pushing the streams already playing below real time (gateway/admission/audio_capacity.py). While it
cannot, or while the audio stages hold as many requests with audio as they take (`Limits.audio`),
the request waits in its own bounded FIFO (`Limits.audio_hold`, the same `queue_timeout`),
without a concurrency slot, so text-only requests never wait behind it; a held request is let in
when an audio stream ends or when the stages report new speeds or room (`reconsider`). Only then does it
take its concurrency slot (one deadline covers both waits). A request that the concurrency bound
would refuse right now is refused at once, before any audio wait, as it always was.

Start guard: a stream whose first chunk is short is fragile until it has some audio in hand
(`Permit.mark_starting` / `settle`, driven by the session from what it hands the client through
gateway/admission/start_guard.py). A fragile stream says what it needs: the headroom its first chunk
was sized for (the smallest at which its listener is predicted never to wait,
gateway/admission/audio_capacity.py). A new audio request starts beside fragile ones only while the
headroom with it still meets every fragile stream's need, so one more stream never undoes the plan a
starting one was given; otherwise (or when a fragile stream's need or the speed is unknown) it waits
in the same queue, and when the last fragile stream settles the waiting ones are let in together,
each sized (its first chunk, gateway/admission/audio_planner.py) knowing all the others that
start with it.
Without the guard, the first two or three of a wave of simultaneous requests were sized while they
looked alone (2-frame first chunks) and then ran dry while the rest of the wave's prompts were
prefilled beside them (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from gateway.admission.limits import Limits, Room
from omnistream.request.errors import Overloaded

DEFAULT_QUEUE_TIMEOUT_S = 10.0  # seconds a request may wait for admission (GatewayConfig.queue_timeout)

# (running audio streams, the headroom fragile ones need or None) -> may one more start?
# (None as the gate: no audio hold)
AudioGate = Callable[[int, float | None], bool]
# (reason, request id) of a request that starts waiting in the audio hold; the reasons:
HOLD_REASONS = ("capacity", "start_guard", "queue", "room")
OnHold = Callable[[str, str | None], None]


class Rejected(Overloaded):
    """Overloaded, with the reason (for metrics) and a hint for Retry-After."""

    def __init__(self, message: str, reason: str, retry_after: int) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class Admission:
    def __init__(
        self,
        max_concurrency: int | None = None,
        max_queue: int | None = None,
        queue_timeout: float = DEFAULT_QUEUE_TIMEOUT_S,
        retry_after: int = 1,
        *,
        room: Callable[[], Room] | None = None,
        audio_gate: AudioGate | None = None,
        max_audio_hold: int | None = None,
        on_hold: OnHold | None = None,
    ) -> None:
        """`max_concurrency`, `max_queue`, `max_audio_hold`: the operator's caps (None: derived from
        `room`, what the stages hold now, read at every decision: limits.py); `audio_gate`: the
        audio hold's rule (None: no hold); `on_hold`: called with the reason (HOLD_REASONS: the gate
        said no, a starting stream is fragile, others wait already, the audio stages are full) for
        every request that starts waiting there (a metric and a log line)."""
        if max_concurrency is None and room is None:
            raise ValueError("admission needs max_concurrency or the stages' room")
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.max_audio_hold = max_audio_hold
        self.room = room
        self.queue_timeout = queue_timeout
        self.retry_after = retry_after
        self.audio_gate = audio_gate
        self.on_hold = on_hold
        self.active = 0
        self.audio_active = 0  # permits of requests with audio (their streams are playing)
        self._fragile: set[Permit] = set()  # of those, the fragile ones (the start guard, module docstring)
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._audio_waiters: deque[asyncio.Future[None]] = deque()

    def limits(self) -> Limits:
        """The limits now: the caps given, the rest from what the stages report now."""
        room = self.room() if self.room is not None and self.max_concurrency is None else None
        return Limits.of(room, self.max_concurrency, self.max_queue, self.max_audio_hold)

    @property
    def audio_starting(self) -> int:
        """Audio streams that are fragile right now (the start guard)."""
        return len(self._fragile)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def audio_held(self) -> int:
        """Audio requests waiting for audio capacity right now."""
        return len(self._audio_waiters)

    async def acquire(self, audio: bool = False, request_id: str | None = None) -> Permit:
        """A permit; with `audio`, only once the audio gate lets one more stream start."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.queue_timeout
        if audio:
            if self._concurrency_full():
                raise self._refusal(self.limits())
            await self._acquire_audio(deadline, request_id)
        held = loop.time() - started
        try:
            await self._acquire_slot(deadline)
        except BaseException:
            if audio:
                self._release_audio()
            raise
        permit = Permit(self, audio)
        permit.held_s, permit.waited_s = held, loop.time() - started
        return permit

    def _concurrency_full(self) -> bool:
        """Would `_acquire_slot` refuse right now?"""
        limits = self.limits()
        free = self.active < limits.concurrency and not self._waiters
        return not free and len(self._waiters) >= limits.queue

    def _refusal(self, limits: Limits) -> Rejected:
        return Rejected(
            f"server is at its limit of {limits.concurrency} concurrent requests"
            + (f" and {limits.queue} queued" if limits.queue else ""),
            reason="concurrency" if not limits.queue else "queue_full",
            retry_after=self.retry_after,
        )

    async def _acquire_slot(self, deadline: float) -> None:
        limits = self.limits()
        if self.active < limits.concurrency and not self._waiters:
            self.active += 1
            return
        if len(self._waiters) >= limits.queue:
            raise self._refusal(limits)
        await self._wait(self._waiters, deadline, self._release, "no capacity", "queue_timeout")

    def _audio_full(self) -> bool:
        """Do the audio stages hold as many requests with audio as they take (limits.py)?"""
        audio = self.limits().audio
        return audio is not None and self.audio_active >= audio

    def _audio_room(self) -> bool:
        if self._audio_full():
            return False
        if self.audio_gate is None:
            return True
        needs = [permit.need for permit in self._fragile]
        if not needs:
            return self.audio_gate(self.audio_active, None)
        if None in needs:
            return False  # a fragile stream whose need is unknown: wait until it settles
        return self.audio_gate(self.audio_active, max(n for n in needs if n is not None))

    def hold_reason(self) -> str:
        """Why a new audio request would wait now (one of HOLD_REASONS)."""
        if self._audio_waiters:
            return "queue"
        if self._audio_full():
            return "room"
        return "start_guard" if self.audio_starting else "capacity"

    async def _acquire_audio(self, deadline: float, request_id: str | None = None) -> None:
        if not self._audio_waiters and self._audio_room():
            self.audio_active += 1
            return
        hold = self.limits().audio_hold
        if len(self._audio_waiters) >= hold:
            why = (
                f"the audio stages hold {self.audio_active} requests with audio, all they take"
                if self._audio_full()
                else f"the audio stages are at the speed their {self.audio_active} playing streams need"
            )
            raise Rejected(
                why + (f", and {hold} requests wait for audio" if hold else ""),
                reason="audio_capacity" if not hold else "audio_hold_full",
                retry_after=self.retry_after,
            )
        if self.on_hold is not None:
            self.on_hold(self.hold_reason(), request_id)
        await self._wait(
            self._audio_waiters, deadline, self._release_audio, "no audio capacity", "audio_hold_timeout"
        )

    async def _wait(
        self,
        queue: deque[asyncio.Future[None]],
        deadline: float,
        give_back: Callable[[], None],
        what: str,
        reason: str,
    ) -> None:
        """Wait in `queue` until granted (the granter counted us in), until `deadline` (Rejected),
        or until cancelled (a grant that raced either is handed back with `give_back`)."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        queue.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), max(0.0, deadline - loop.time()))
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():
                return  # granted just as the timer fired
            waiter.cancel()
            with contextlib.suppress(ValueError):
                queue.remove(waiter)
            raise Rejected(
                f"{what} within {self.queue_timeout:g}s", reason=reason, retry_after=self.retry_after
            ) from None
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                give_back()  # granted but the caller went away
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)
            raise

    async def acquire_now(self, audio: bool = False) -> Permit:
        """Re-take the slot a failed attempt of the same request just released (retries skip the queue)."""
        self.active += 1
        if audio:
            self.audio_active += 1
        return Permit(self, audio)

    def _release(self) -> None:
        self.active -= 1
        self._grant_slots()

    def _grant_slots(self) -> None:
        """Hand the free slots to the waiting requests, oldest first (each counted in for it)."""
        concurrency = self.limits().concurrency
        while self._waiters and self.active < concurrency:
            waiter = self._waiters.popleft()
            if not waiter.done():  # else gone (timed out or cancelled) but not yet removed
                self.active += 1
                waiter.set_result(None)

    def _release_audio(self) -> None:
        self.audio_active -= 1
        self.reconsider()

    def _settled(self, permit: Permit) -> None:
        self._fragile.discard(permit)
        self.reconsider()  # the needs left may let a held request in (all of them once none is left)

    def reconsider(self) -> None:
        """Let in the waiting requests that fit now, oldest first (after a stream ended or settled,
        or when the stages reported new speeds or room). Held audio requests let in here are not
        fragile yet (their plans are chosen once they resume), so one round lets in the whole group
        the guard held, each counted in before the next is judged."""
        self._grant_slots()
        while self._audio_waiters:
            waiter = self._audio_waiters[0]
            if waiter.done():  # gone (timed out or cancelled) but not yet removed
                self._audio_waiters.popleft()
                continue
            if not self._audio_room():
                return
            self._audio_waiters.popleft()
            self.audio_active += 1  # counted in for it, as `_release` hands a slot over
            waiter.set_result(None)


class Permit:
    def __init__(self, admission: Admission, audio: bool = False) -> None:
        self._admission = admission
        self.audio = audio  # counted among the audio streams (Admission.audio_active)
        self.starting = False  # counted among the fragile ones (Admission.audio_starting)
        self.need: float | None = None  # the headroom its first chunk was sized for (None: unknown)
        # Seconds `acquire` waited in all, and of those in the audio hold (the request's span says).
        self.waited_s = 0.0
        self.held_s = 0.0
        self._released = False

    def mark_starting(self, need: float | None = None) -> None:
        """This audio stream is fragile until it `settle`s (start guard): new audio starts beside
        it only while the headroom with them stays at least `need` (None: unknown, they wait)."""
        if self.audio and not self.starting and not self._released:
            self.starting = True
            if need is not None:
                self.need = need
            self._admission._fragile.add(self)

    def settle(self) -> None:
        """The stream has enough audio in hand (or gave up waiting for it, or ended)."""
        if self.starting:
            self.starting = False
            self._admission._settled(self)

    def release(self) -> None:
        if not self._released:
            self.settle()
            self._released = True
            self._admission._release()
            if self.audio:
                self._admission._release_audio()
