"""One admitted request in the gateway: its event buffer, its timings and metrics, its release.

`GatewayCore.open()` (gateway/serving/core.py) makes a `Session` once everything that can refuse the
request has passed; the REST, gRPC and realtime faces then read its `events()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from gateway.admission.permits import Permit
from gateway.admission.start_guard import StartGuard
from gateway.cluster.replica import Replica
from gateway.serving.metrics import GatewayMetrics
from omnistream.audio.listener import AudioArrival, Listening, listen
from omnistream.request.errors import DeadlineExceeded, OmniError, Unavailable
from omnistream.request.generation import AudioEvent, DoneEvent, TextEvent
from omnistream.request.relay import Emit

if TYPE_CHECKING:
    from gateway.serving.tracing import Ended, RequestSpan

AUDIO_BUFFER = 64  # audio chunks held for a slow reader before the stages feel backpressure

Event = TextEvent | AudioEvent | DoneEvent
# What the session reports of a replica whose stage said it is unavailable (Replicas.mark_failed).
MarkFailed = Callable[[Replica], None]


class _Collector:
    """Between the stages and one client: text deltas merge while the reader lags (not while the
    session is held: its reader has not begun, and gets the deltas as they were made), audio never
    drops (when `AUDIO_BUFFER` chunks wait, reading from the stages pauses: backpressure, not loss)."""

    def __init__(self, merge_text: bool = True) -> None:
        self.merge_text = merge_text
        self._items: deque[Event | BaseException] = deque()
        self._audio = 0
        self._changed = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.closed = False

    async def put(self, item: Event | BaseException) -> None:
        if (
            isinstance(item, TextEvent)
            and self.merge_text
            and self._items
            and isinstance(self._items[-1], TextEvent)
        ):
            last = self._items[-1]
            self._items[-1] = TextEvent(last.token_ids + item.token_ids, last.delta + item.delta)
        else:
            if isinstance(item, AudioEvent):
                while self._audio >= AUDIO_BUFFER:
                    self._room.clear()
                    await self._room.wait()
                self._audio += 1
            self._items.append(item)
        self._changed.set()

    def audio_seconds(self) -> float:
        """Seconds of the audio waiting in it."""
        return sum(i.audio.size / i.sample_rate for i in self._items if isinstance(i, AudioEvent))

    async def get(self) -> Event | BaseException:
        while not self._items:
            self._changed.clear()
            await self._changed.wait()
        item = self._items.popleft()
        if isinstance(item, AudioEvent):
            self._audio -= 1
            self._room.set()
        return item


@dataclass
class Timings:
    started: float
    first_text: float | None = None
    last_text: float | None = None
    first_audio: float | None = None
    last_audio: float | None = None
    ended: float | None = None  # when the DoneEvent was handed out
    audio_seconds: float = 0.0
    # Each audio chunk as the client was handed it (the listener model, omnistream/audio/listener.py)
    audio_chunks: list[AudioArrival] = field(default_factory=list)


class Session:
    """One admitted request. Iterate `events()`; `aclose()` (or leaving the loop) cancels the stages."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        mark_failed: MarkFailed,
        request_id: str,
        permit: Permit,
        replicas: list[Replica],
        body: Callable[[Emit], Awaitable[DoneEvent]],
        deadline: float,
        first_chunk_s: float | None = None,
        start_guard: float = 0.0,
        trace: RequestSpan | None = None,
        held: bool = False,
    ) -> None:
        """`metrics`: where the request's latencies and end go; `mark_failed`: called for each of its
        replicas whose stage said it is unavailable (the core takes it out of rotation). Passed in,
        not read off the core: a session needs nothing else of it.
        `first_chunk_s`: the audio seconds of the request's first chunk, when it has audio; while
        a stream that started with less than `start_guard` seconds has less than that in hand, new
        audio starts wait (the start guard, gateway/admission/start_guard.py).
        `trace`: the request's span (gateway/serving/tracing.py), ended by `aclose` once `prime`
        succeeded; before that the core ends it (a failed attempt may be retried on another replica).
        `held`: a speculative request (gateway/realtime/speculation.py), run ahead of its caller's
        decision: what it makes waits here, unmeasured, until `release` (its timings count from
        there, as the caller's request)."""
        self._metrics = metrics
        self._mark_failed = mark_failed
        self.request_id = request_id
        self._permit = permit
        self._replicas = replicas
        self._body = body  # runs the request, emitting into the collector: its one buffer
        self._deadline = deadline
        self._collector = _Collector(merge_text=not held)
        self._pump: asyncio.Task[None] | None = None
        self.timings = Timings(time.perf_counter())
        self.done: DoneEvent | None = None
        self._closed = False
        self._status = "cancelled"
        self.error: BaseException | None = None  # what ended it, when an error did
        self._trace = trace
        self._owns_trace = False
        self._first: Event | None = None
        # A held stream plays nothing before its release, so it cannot stall: not fragile until then
        self._first_chunk_s, self._guard_s = first_chunk_s, start_guard
        self._start_guard = StartGuard(permit, None if held else first_chunk_s, start_guard)
        self.held = held

    def _audio_in_hand(self, now: float) -> float:
        """Seconds of audio the listener has received but not yet played (listener model)."""
        t = self.timings
        assert t.first_audio is not None  # called once audio came
        played = now - t.first_audio - self.listening().stall_s
        return t.audio_seconds - played

    async def _run_source(self) -> None:
        try:
            async with asyncio.timeout_at(self._deadline):
                done = await self._body(self._collector.put)
            await self._collector.put(done)
        except TimeoutError:
            await self._collector.put(DeadlineExceeded("the request exceeded its timeout"))
        except BaseException as exc:  # handed to the reader, which raises it
            await self._collector.put(exc)

    def start(self) -> None:
        self._pump = asyncio.create_task(self._run_source())

    @property
    def first_chunk_s(self) -> float | None:
        """The audio seconds of the first chunk the audio planner chose for it (None: no audio)."""
        return self._first_chunk_s

    @property
    def trace(self) -> RequestSpan | None:
        """The request's span (for what its caller measures of it: `RequestSpan.note`)."""
        return self._trace

    @property
    def replica_addresses(self) -> dict[str, str]:
        """The replica serving each stage of this request (the realtime API reports them)."""
        return {replica.stage: replica.address for replica in self._replicas}

    def release(self, since: float | None = None) -> float:
        """A held session becomes its caller's request now: its clock starts at `since` (the
        caller's request began: time.perf_counter(); None: now) and what it made while held is
        measured as arriving now. Returns the seconds it was held."""
        assert self.held, "only a held session is released"
        now = time.perf_counter()
        held_s = now - self.timings.started
        self.held = False
        self._collector.merge_text = True
        # Its listener starts now with all it made in hand (the first event and what waits in the
        # collector: nothing was read while held): fragile if that is under the guard.
        if self._first_chunk_s is not None:
            first = self._first
            made = self._collector.audio_seconds()
            made += first.audio.size / first.sample_rate if isinstance(first, AudioEvent) else 0.0
            in_hand = made or self._first_chunk_s
            self._start_guard = StartGuard(self._permit, in_hand, self._guard_s)
        self.timings.started = now if since is None else min(since, now)
        if self._first is not None:
            self._observe(self._first, now)
        return held_s

    async def next_event(self) -> Event:
        item = await self._collector.get()
        if isinstance(item, BaseException):
            self.error = item
            if isinstance(item, OmniError):
                self._note_failure(item)
            raise item
        if not self.held:
            self._observe(item, time.perf_counter())
        return item

    def _observe(self, item: Event, now: float) -> None:
        """An event reaches the caller at `now`: the request's timings and latency metrics."""
        t = self.timings
        m = self._metrics
        if isinstance(item, TextEvent):
            if t.first_text is None:
                t.first_text = now
                m.ttft.observe(now - t.started)
            elif t.last_text is not None:
                m.itl.observe(now - t.last_text)
            t.last_text = now
        elif isinstance(item, AudioEvent):
            if t.first_audio is None:
                t.first_audio = now
                m.ttfp.observe(now - t.started)
            t.last_audio = now
            t.audio_seconds += item.audio.size / item.sample_rate
            t.audio_chunks.append(AudioArrival(now, item.audio.size, item.sample_rate))
            self._start_guard.on_audio(lambda: self._audio_in_hand(now))
        elif isinstance(item, DoneEvent):
            self.done = item
            t.ended = now
            m.e2e.observe(now - t.started)
            if t.audio_seconds > 0 and t.last_audio is not None:
                m.rtf.observe((t.last_audio - t.started) / t.audio_seconds)
            heard = self.listening()
            if heard.heard:
                m.observe_listening(heard)
            self._status = "ok"

    @property
    def status(self) -> str:
        """How it ended (or ends, if it stopped now): ok, cancelled, or the error's kind."""
        return self._status

    def listening(self) -> Listening:
        """What a listener playing this request's audio as the gateway handed it out heard so far
        (all of it once the request is done): stalls, underrun, continuity."""
        return listen(self.timings.audio_chunks)

    async def prime(self) -> None:
        """Wait for the first event, so that a stage refusing the request surfaces as an error of
        `open()` (an HTTP status) rather than in the middle of a stream."""
        try:
            self._first = await self.next_event()
        except BaseException as exc:
            self._status = exc.kind if isinstance(exc, OmniError) else "cancelled"
            await self.aclose()
            raise
        self._owns_trace = True

    async def events(self) -> AsyncGenerator[Event, None]:
        try:
            while True:
                if self._first is not None:
                    event, self._first = self._first, None
                else:
                    event = await self.next_event()
                yield event
                if isinstance(event, DoneEvent):
                    return
        except OmniError as exc:
            self._status = exc.kind
            raise
        finally:
            await self.aclose()

    def _note_failure(self, error: OmniError) -> None:
        if error.kind == Unavailable.kind and error.stage is not None:
            for replica in self._replicas:
                if replica.stage == error.stage:
                    self._mark_failed(replica)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._start_guard.cancel()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(BaseException):
                await self._pump
        for replica in self._replicas:
            replica.inflight -= 1
        self._permit.release()
        self._metrics.in_flight.dec()
        self._metrics.finished.labels(status=self._status).inc()
        if self._owns_trace and self._trace is not None:
            # What the span reads of the session (tracing.Ended), whose `timings` it only reads.
            self._trace.finish(cast("Ended", self))
