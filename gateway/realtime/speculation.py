"""The answer prepared during the silence before the turn detector decides.

The server VAD decides a turn is over after a window of silence (500 ms by default); the turn's audio
was complete when that silence began. Once the silence has lasted the window less the gateway's
`realtime_speculation_lead_ms`, the detector reports a pause (gateway/realtime/vad.py) and the
responder starts, speculatively, the response the decision would start: on exactly the audio the
commit will hold (the buffer up to the end of speech the detector found, which the `stopped` that
follows commits), decoded as the commit decodes it, its request built as for a response to the
committed turn, on a copy of the conversation with the turn in it (gateway/realtime/responder.py).
It is admitted and runs through the stages as any request (`GatewayCore.open(held=True)`); what it
makes waits, unmeasured, in its session (gateway/serving/session.py).

When the detector decides, the commit takes the speculation's decoded audio (the same samples) and
the response started for the turn builds its request as always. When that request equals the
speculation's (`same`), the held session is released to it: its text and audio, ready by then, flow
at once, and the response is the one an ordinary commit would have produced, since it is the same
request. Otherwise (the session changed meanwhile: an update, an item, a response running) the
speculation is cancelled and the response opens its own. If the user speaks again first (`resumed`),
or the buffer is cleared, the turn detection changes, the client commits, or the session ends, it is
cancelled in every stage (closing its session cancels its stage streams): nothing of it reached the
client or the conversation. Its prefill of the prompt stays in the thinker's prefix cache
(omnistream/engine/prefix_cache.py), exact for the history before the turn.

At most one per session. Counted in omnistream_realtime_speculations_total{outcome} (released,
resumed, changed, unused, failed) and, for all but the released, the seconds they ran in
omnistream_realtime_speculation_wasted_seconds_total.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np

from gateway.serving.metrics import GatewayMetrics
from gateway.serving.session import Session
from omnistream.request.generation import GenerationRequest

Parts = list[dict[str, Any]]
RELEASED, RESUMED, CHANGED, UNUSED, FAILED = "released", "resumed", "changed", "unused", "failed"


def same(a: Any, b: Any) -> bool:
    """Are two requests (or any parts of them) the same input to the stages? Structural, with
    arrays compared by value (a message's media are decoded arrays)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, Mapping):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, Sequence) and not isinstance(a, (str, bytes)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


class Speculation:
    """One speculative response: the turn's audio (`pcm`, up to stream sample `end`), decoded by
    `decode`, its request made by `build` from the decoded parts, opened held by `open`."""

    def __init__(
        self,
        end: int,
        pcm: bytes,
        metrics: GatewayMetrics,
        decode: Callable[[], Awaitable[Parts]],
        build: Callable[[Parts], Awaitable[GenerationRequest | None]],
        open_held: Callable[[GenerationRequest], Awaitable[Session]],
    ) -> None:
        self.end = end
        self.pcm = pcm
        self.metrics = metrics
        self.started = time.monotonic()
        loop = asyncio.get_running_loop()
        self._parts: asyncio.Future[Parts | None] = loop.create_future()
        self._request: asyncio.Future[GenerationRequest | None] = loop.create_future()
        self._decode, self._build, self._open_held = decode, build, open_held
        self.task = asyncio.create_task(self._run())
        self.outcome: str | None = None

    async def _run(self) -> Session | None:
        try:
            parts = await self._decode()
        except Exception:  # the commit decodes again and reports the error as its own
            parts = None
        self._parts.set_result(parts)
        request = None
        if parts is not None:
            try:
                request = await self._build(parts)
            except Exception:  # what the response would refuse: it refuses it itself
                request = None
        self._request.set_result(request)
        return None if request is None else await self._open_held(request)

    async def parts(self) -> Parts | None:
        """The turn's audio decoded (None: its decode failed)."""
        return await self._parts

    def holds(self, end: int, pcm: bytes) -> bool:
        """Is it made of exactly this committed audio?"""
        return end == self.end and pcm == self.pcm

    async def matches(self, request: GenerationRequest) -> bool:
        """Is `request` (a response's, built as always) the one it runs?"""
        made = await self._request
        if self._failed():
            return False  # its open was refused earlier: the response's own open may not be
        return made is not None and same(made, request)

    async def session(self, since: float | None = None, response_id: str = "") -> Session:
        """Its session, released to the response `response_id` that takes it, asked for at `since`
        (time.perf_counter(); its latencies count from there); the open's error, if it failed."""
        self.outcome = RELEASED
        try:
            session = await self.task
        except BaseException as exc:  # its open failed, or the response was stopped meanwhile
            cancelled = isinstance(exc, asyncio.CancelledError)
            self.metrics.speculations.labels(outcome=UNUSED if cancelled else FAILED).inc()
            raise
        assert session is not None, "a speculation that built no request is never taken"
        held_s = session.release(since)
        self.metrics.speculations.labels(outcome=RELEASED).inc()
        if session.trace is not None:
            noted = {"omnistream.realtime.response_id": response_id}
            session.trace.note({**noted, "omnistream.realtime.speculation_held": held_s})
        return session

    def _failed(self) -> bool:
        """Its run ended with an error (its open was refused)."""
        return self.task.done() and not self.task.cancelled() and self.task.exception() is not None

    async def cancel(self, outcome: str) -> None:
        """Stop it in every stage (its session closed), counted as `outcome`."""
        if self.outcome is not None:
            return
        self.outcome = outcome
        self.task.cancel()
        await asyncio.wait({self.task})
        if self._failed():
            outcome = FAILED
        elif not self.task.cancelled() and (session := self.task.result()) is not None:
            await session.aclose()
        self.metrics.speculations.labels(outcome=outcome).inc()
        self.metrics.speculation_wasted.inc(time.monotonic() - self.started)
        with contextlib.suppress(asyncio.InvalidStateError):
            self._parts.set_result(None)
        with contextlib.suppress(asyncio.InvalidStateError):
            self._request.set_result(None)
