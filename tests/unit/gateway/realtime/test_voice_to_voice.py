"""Voice-to-voice (voice_to_voice.py) on a connection over fake stages: a turn the VAD ends is placed
at the arrival of the append that held its end, a client's commit at its last append's; the response
started for that turn measures from there to its first audio delta, into the histogram (labelled by
what decided the turn), response.done's `voice_to_voice_ms` and the response's span; a response
that answers no fresh audio turn (a second one, one after a text item, an out-of-band one)
measures nothing. The real stack's: tests/integration/test_realtime_voice_to_voice.py."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import pytest

from gateway.realtime.voice_to_voice import SpokenTurn, first_audio
from gateway.serving import tracing
from gateway.serving.metrics import GatewayMetrics
from omnistream.request.generation import GenerationRequest
from tests.unit.gateway.realtime.test_server_event_schemas import FakeSession, connect

HISTOGRAM = "omnistream_realtime_voice_to_voice_seconds"
QUARTER_SECOND = base64.b64encode(bytes(12000)).decode()  # 6000 samples of silence at 24 kHz


def count(metrics: GatewayMetrics, detection: str) -> float:
    return metrics.registry.get_sample_value(f"{HISTOGRAM}_count", {"turn_detection": detection}) or 0.0


async def timed_append(send: Any) -> tuple[float, float]:
    """Append a quarter second; the monotonic times around its handling."""
    before = time.monotonic()
    await send(type="input_audio_buffer.append", audio=QUARTER_SECOND)
    after = time.monotonic()
    await asyncio.sleep(0.03)
    return before, after


def dones(events: list[dict]) -> list[dict]:
    return [e["response"] for e in events if e["type"] == "response.done"]


def test_a_vad_turn_is_measured_from_the_append_that_held_its_end_to_the_first_audio():
    async def run() -> tuple[Any, ...]:
        conn, core, events, send = connect(beta=False)
        vad = {"type": "server_vad", "prefix_padding_ms": 1000}
        await send(
            type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": vad}}}
        )
        first = await timed_append(send)
        await timed_append(send)
        await conn.input_audio.speech_started(0)
        core.answers.append(FakeSession("Hello", audio=True))
        item_id = conn.input_audio.turn_item_id
        await conn.input_audio.speech_stopped(3000)  # in the first append
        spoken = conn.conversation.items[item_id].spoken  # taken by the response: gone
        assert conn.response is not None
        response = conn.response
        turn = response.spoken
        await response.wait()
        return first, turn, spoken, response.voice_to_voice_s, dones(events), core.metrics

    (before, after), turn, left, seconds, (done,), metrics = asyncio.run(run())
    assert isinstance(turn, SpokenTurn) and turn.detection == "server_vad" and left is None
    assert before <= turn.speech_ended_at <= after < turn.decided_at
    assert seconds is not None and seconds > turn.decided_at - turn.speech_ended_at > 0.03
    assert done["omnistream"]["voice_to_voice_ms"] == pytest.approx(seconds * 1000, abs=0.06)
    assert done["omnistream"]["first_chunk_ms"] == 160.0  # the session's planned first chunk
    assert count(metrics, "server_vad") == 1 and count(metrics, "none") == 0


def test_a_client_commit_is_measured_once_from_its_last_append_and_other_responses_measure_nothing():
    async def run() -> tuple[Any, ...]:
        conn, core, events, send = connect(beta=False)
        await send(
            type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        )
        await timed_append(send)
        last = await timed_append(send)
        await send(type="input_audio_buffer.commit")
        turn = conn.conversation.items[conn.conversation.last_id()].spoken  # type: ignore[index]
        core.answers += [FakeSession("Aside", audio=True), FakeSession("Hi", audio=True)]
        await send(type="response.create", response={"conversation": "none"})  # answers no turn
        await send(type="response.create")  # the turn's answer
        core.answers.append(FakeSession("Again", audio=True))
        await send(type="response.create")  # no new turn since
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
        await send(type="conversation.item.create", item=item)
        core.answers.append(FakeSession("Text", audio=True))
        await send(type="response.create")  # a text turn
        return last, turn, dones(events), core.metrics

    (before, after), turn, responses, metrics = asyncio.run(run())
    assert isinstance(turn, SpokenTurn) and turn.detection == "none"
    assert before <= turn.speech_ended_at <= after < turn.decided_at
    measured = [r["omnistream"]["voice_to_voice_ms"] for r in responses]
    assert measured[0] is None and measured[1] > 0 and measured[2:] == [None, None]
    assert [r["status"] for r in responses] == ["completed"] * 4
    assert count(metrics, "none") == 1 and count(metrics, "server_vad") == 0


def test_the_first_audio_sets_the_voice_to_voice_on_the_responses_span(spans):
    metrics = GatewayMetrics()
    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    span = tracing.RequestSpan(tracing.realtime_entry("resp_1"), "r1", request)
    turn = SpokenTurn("semantic_vad", speech_ended_at=10.0, decided_at=10.8)
    assert first_audio(turn, metrics, span, now=11.0) == pytest.approx(1.0)
    span.refused(asyncio.CancelledError())  # any end: what was noted stays
    span.note({"omnistream.realtime.voice_to_voice": 5.0})  # once ended: nothing
    (done,) = spans.get_finished_spans()
    assert done.attributes is not None
    assert done.attributes["omnistream.realtime.voice_to_voice"] == pytest.approx(1.0)
    assert done.attributes["omnistream.realtime.turn_detection"] == "semantic_vad"
    assert done.attributes["omnistream.realtime.turn_detection_latency"] == pytest.approx(0.8)
    assert count(metrics, "semantic_vad") == 1
    assert metrics.registry.get_sample_value(f"{HISTOGRAM}_sum", {"turn_detection": "semantic_vad"}) == 1.0
