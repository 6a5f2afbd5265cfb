"""The answer prepared during the silence (gateway/realtime/speculation.py), on the real processes: a
turn the server VAD ends (espeak-ng speech streamed at real time, then silence) is answered by the
speculation started at its pause, released at the decision; the answer (transcript and audio, byte
for byte) is the one an ordinary commit of the same audio gets: greedy, float64 stages, on both
tiny builds (the other seed and size and the real-shaped checkpoint in `make test-slow`). A pause
the user speaks after cancels its speculation in every stage (counted as resumed), nothing of it
reaches the client, and the turn's answer (seeded sampling) is again the ordinary commit's."""

from __future__ import annotations

import asyncio
import base64
import re
import urllib.request

import pytest

from tests.integration.conftest import (
    configured_gateway,
    gateway_idle,
    gateway_url,
    stages_on,
    wait_for,
)
from tests.integration.test_realtime_protocol import Client, b64, connect, opened
from tests.integration.test_realtime_voice_to_voice import stream
from tests.speech import RATE, silence_pcm16, speech_pcm16

API_KEY = "speculation-test-key"
COUNTER = "omnistream_realtime_speculations_total"
VAD = {"type": "server_vad", "silence_duration_ms": 500}  # speculation after 200 ms (lead 300)
SAMPLED = {"max_output_tokens": 8, "omnistream": {"seed": 1, "max_audio_frames": 24, "ignore_eos": True}}
GREEDY = {**SAMPLED, "temperature": 0.0}
# Leading silence shorter than the VAD's prefix padding (300 ms): the committed turn is the stream
# from its first sample, so the ordinary commit below can send exactly the same audio.
LEAD_S = 0.1


@pytest.fixture(scope="module", params=["stages", "ending_stages"])
def gateway(request, tmp_path_factory):
    stages = request.getfixturevalue(request.param)
    directory = tmp_path_factory.mktemp(f"speculation-{request.param}")
    with configured_gateway(stages, directory, {"api_key": API_KEY}) as gw:
        yield gw, stages


def speculations(gateway) -> dict[str, float]:
    body = urllib.request.urlopen(f"{gateway_url(gateway)}/metrics", timeout=10).read().decode()
    return {k: float(v) for k, v in re.findall(rf'^{COUNTER}\{{outcome="(\w+)"\}} (\S+)$', body, re.M)}


def grew(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


async def answer(c: Client) -> tuple[str, bytes]:
    """The response's transcript and its audio (every delta, joined)."""
    audio = b""
    async with asyncio.timeout(60):
        while True:
            event = await c.next()
            if event["type"] == "response.output_audio.delta":
                audio += base64.b64decode(event["delta"])
            if event["type"] == "response.done":
                assert event["response"]["status"] in ("completed", "incomplete"), event
                (item,) = event["response"]["output"]
                return item["content"][0]["transcript"], audio


async def spoken(gateway, pcm: bytes, answer_with: dict) -> tuple[tuple[str, bytes], int, list[dict]]:
    """A session with server_vad hears `pcm` at real time: its answer, where the VAD ended the
    turn (in samples of the stream) and every event it sent."""
    async with connect(gateway, key=API_KEY) as ws:
        c = await opened(ws)
        session = {"type": "realtime", "audio": {"input": {"turn_detection": VAD}}, **answer_with}
        await c.send({"type": "session.update", "session": session})
        await c.until("session.updated")
        microphone = asyncio.create_task(stream(c, pcm))
        try:
            found = await answer(c)
        finally:
            await microphone
        stopped = next(e for e in c.seen if e["type"] == "input_audio_buffer.speech_stopped")
        started = next(e for e in c.seen if e["type"] == "input_audio_buffer.speech_started")
        assert started["audio_start_ms"] <= 300, started  # the buffer kept the stream from its start
        return found, stopped["audio_end_ms"] * RATE // 1000, c.seen


async def committed(gateway, pcm: bytes, answer_with: dict) -> tuple[str, bytes]:
    """The ordinary path: a session without turn detection commits `pcm` and asks for the answer."""
    async with connect(gateway, key=API_KEY) as ws:
        c = await opened(ws)
        session = {"type": "realtime", "audio": {"input": {"turn_detection": None}}, **answer_with}
        await c.send({"type": "session.update", "session": session})
        await c.until("session.updated")
        await c.send({"type": "input_audio_buffer.append", "audio": b64(pcm)})
        await c.send({"type": "input_audio_buffer.commit"})
        await c.send({"type": "response.create"})
        return await answer(c)


def released_as_committed(gw, stages) -> None:
    """One spoken turn: released from its speculation, and the answer of its ordinary commit."""
    pcm = silence_pcm16(LEAD_S) + speech_pcm16("Hello there, how are you?") + silence_pcm16(0.9)
    before = speculations(gw)
    (text, audio), end, seen = asyncio.run(spoken(gw, pcm, GREEDY))
    assert grew(before, speculations(gw)) == {"released": 1.0}
    assert [e["type"] for e in seen].count("response.created") == 1
    assert audio and (text, audio) == asyncio.run(committed(gw, pcm[: end * 2], GREEDY))
    assert asyncio.run(wait_for(lambda: gateway_idle(gw, stages), timeout=10))


def test_a_decided_turn_is_answered_by_its_speculation_as_an_ordinary_commit_would_be(gateway):
    released_as_committed(*gateway)


@pytest.mark.slow
@pytest.mark.parametrize("build", ["other_tiny_model_dir", "real_shaped_model_dir"])
def test_on_another_build_too(build, request, tmp_path):
    with (
        stages_on(request.getfixturevalue(build)) as stages,
        configured_gateway(stages, tmp_path, {"api_key": API_KEY}) as gw,
    ):
        released_as_committed(gw, stages)


def test_speech_resumed_after_a_pause_cancels_its_speculation_and_the_turn_answers_as_without(gateway):
    gw, stages = gateway
    first, second = speech_pcm16("Hello there, how are you?"), speech_pcm16("And what is the weather today?")
    # 150 ms between them: the VAD hears ~340 ms of silence (espeak's quiet tail), past the pause
    # (200 ms) and short of the window (500 ms): one turn, one speculation cancelled.
    pcm = silence_pcm16(LEAD_S) + first + silence_pcm16(0.15) + second + silence_pcm16(0.9)
    before = speculations(gw)
    (text, audio), end, seen = asyncio.run(spoken(gw, pcm, SAMPLED))
    assert grew(before, speculations(gw)) == {"resumed": 1.0, "released": 1.0}
    kinds = [e["type"] for e in seen]
    assert kinds.count("response.created") == 1 and kinds.count("input_audio_buffer.committed") == 1
    assert end * 2 > len(silence_pcm16(LEAD_S) + first)  # the turn held both phrases
    assert audio and (text, audio) == asyncio.run(committed(gw, pcm[: end * 2], SAMPLED))
    assert asyncio.run(wait_for(lambda: gateway_idle(gw, stages), timeout=10))
