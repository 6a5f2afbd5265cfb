"""A speculation's life (speculation.py) with scripted decode, build and open: the response that
makes the same request takes its session, released; any other cancel closes it (a session being
opened is cancelled, an opened one closed), counted by outcome with the seconds it ran; a decode or
build that fails leaves a speculation nothing can take. `same` compares requests by value, media
arrays included."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest

from gateway.admission.permits import Rejected
from gateway.realtime.speculation import CHANGED, FAILED, RELEASED, RESUMED, Speculation, same
from gateway.serving.metrics import GatewayMetrics
from omnistream.request.generation import GenerationRequest
from omnistream.request.media import AudioInput


def request(samples: np.ndarray, **fields: Any) -> GenerationRequest:
    content = [{"type": "audio", "audio": AudioInput(samples, 16000)}]
    return GenerationRequest(messages=[{"role": "user", "content": content}], **fields)


def test_same_compares_requests_by_value_with_their_media():
    samples = np.linspace(-1, 1, 1600, dtype=np.float32)
    assert same(request(samples), request(samples.copy()))
    changed = samples.copy()
    changed[7] += 1e-6
    assert not same(request(samples), request(changed))
    assert not same(request(samples), request(samples.astype(np.float64)))
    assert not same(request(samples), request(samples, max_tokens=9))
    assert not same(request(samples), dataclasses.replace(request(samples), cache_scope=b"x"))


class FakeSession:
    def __init__(self) -> None:
        self.released = self.closed = False
        self.trace = None

    def release(self, since: float | None = None) -> float:
        self.released = True
        return 0.1

    async def aclose(self) -> None:
        self.closed = True


class Script:
    """Decode, build and open as the responder gives them; `opened` lets the open finish."""

    def __init__(
        self, *, decode_fails: bool = False, build_fails: bool = False, open_fails: bool = False
    ) -> None:
        self.decode_fails, self.build_fails, self.open_fails = decode_fails, build_fails, open_fails
        self.opened = asyncio.Event()
        self.session = FakeSession()
        self.open_cancelled = False
        self.samples = np.ones(1600, np.float32)

    async def decode(self) -> list[dict[str, Any]]:
        if self.decode_fails:
            raise ValueError("not audio")
        return [{"type": "audio", "audio": AudioInput(self.samples, 16000)}]

    async def build(self, parts: list[dict[str, Any]]) -> GenerationRequest:
        if self.build_fails:
            raise ValueError("a tool choice that does not fit")
        return request(parts[0]["audio"].samples)

    async def open(self, made: GenerationRequest) -> Any:
        if self.open_fails:
            raise Rejected("the queue is full", "queue_full", 1)
        try:
            await self.opened.wait()
        except asyncio.CancelledError:
            self.open_cancelled = True
            raise
        return self.session

    def speculation(self, metrics: GatewayMetrics) -> Speculation:
        return Speculation(480, b"\0\0" * 480, metrics, self.decode, self.build, self.open)


def counted(metrics: GatewayMetrics, outcome: str) -> float:
    return (
        metrics.registry.get_sample_value("omnistream_realtime_speculations_total", {"outcome": outcome}) or 0
    )


def wasted(metrics: GatewayMetrics) -> float:
    return metrics.registry.get_sample_value("omnistream_realtime_speculation_wasted_seconds_total") or 0


async def test_the_response_with_the_same_request_takes_its_session_released():
    metrics, script = GatewayMetrics(), Script()
    speculation = script.speculation(metrics)
    assert speculation.holds(480, b"\0\0" * 480) and not speculation.holds(960, b"\0\0" * 480)
    assert not await speculation.matches(request(script.samples, max_tokens=3))
    assert await speculation.matches(request(script.samples.copy()))
    script.opened.set()
    session = await speculation.session()
    assert session is script.session and session.released and not session.closed
    assert counted(metrics, RELEASED) == 1 and wasted(metrics) == 0
    await speculation.cancel(RESUMED)  # taken: nothing left to cancel
    assert counted(metrics, RESUMED) == 0 and not session.closed


@pytest.mark.parametrize("opened", [False, True])
async def test_a_cancel_stops_the_open_or_closes_the_session_and_counts_its_time(opened):
    metrics, script = GatewayMetrics(), Script()
    speculation = script.speculation(metrics)
    assert await speculation.matches(request(script.samples))  # built: now opening
    if opened:
        script.opened.set()
        await asyncio.wait({speculation.task})
    await speculation.cancel(RESUMED)
    assert (script.open_cancelled, script.session.closed) == (not opened, opened)
    assert not script.session.released
    assert counted(metrics, RESUMED) == 1 and wasted(metrics) > 0


@pytest.mark.parametrize("fails", ["decode_fails", "build_fails"])
async def test_a_speculation_whose_decode_or_build_failed_is_never_taken(fails):
    metrics, script = GatewayMetrics(), Script(**{fails: True})
    speculation = script.speculation(metrics)
    assert (await speculation.parts() is None) == (fails == "decode_fails")
    assert not await speculation.matches(request(script.samples))
    await speculation.cancel(RESUMED)
    assert counted(metrics, RESUMED) == 1 and not script.session.closed


async def test_a_speculation_whose_open_was_refused_is_not_taken():
    """Refused earlier (a full queue), it leaves the response to open its own, which may get in."""
    metrics, script = GatewayMetrics(), Script(open_fails=True)
    speculation = script.speculation(metrics)
    await asyncio.wait({speculation.task})
    assert not await speculation.matches(request(script.samples))
    await speculation.cancel(CHANGED)
    assert counted(metrics, FAILED) == 1 and counted(metrics, CHANGED) == 0
