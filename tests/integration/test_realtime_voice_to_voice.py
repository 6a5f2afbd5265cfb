"""Voice-to-voice on the real processes: a spoken turn (espeak-ng, streamed in 20 ms pieces at real
time) ended by the server VAD, then one the client commits, each answered with audio; every answer
adds one observation to the gateway's voice-to-voice histogram under what decided its turn, the
value its response.done carries as `voice_to_voice_ms`: positive, and no more than the client
itself saw."""

from __future__ import annotations

import asyncio
import re
import urllib.request

import pytest

from tests.integration.conftest import configured_gateway, gateway_url
from tests.integration.test_realtime_protocol import Client, b64, connect, opened
from tests.speech import RATE, pieces, silence_pcm16, speech_pcm16

API_KEY = "voice-to-voice-test-key"
HISTOGRAM = "omnistream_realtime_voice_to_voice_seconds"
SILENCE_MS = 400
ANSWER = {"max_output_tokens": 8, "omnistream": {"seed": 1, "max_audio_frames": 24, "ignore_eos": True}}


@pytest.fixture(scope="module")
def gateway(stages, tmp_path_factory):
    with configured_gateway(stages, tmp_path_factory.mktemp("voice-to-voice"), {"api_key": API_KEY}) as gw:
        yield gw


def histogram(gateway) -> dict[str, tuple[float, float]]:
    """(count, sum) of the voice-to-voice histogram by turn_detection, as /metrics shows it now."""
    body = urllib.request.urlopen(f"{gateway_url(gateway)}/metrics", timeout=10).read().decode()
    found: dict[str, list[float]] = {}
    pattern = rf'^{HISTOGRAM}_(count|sum)\{{turn_detection="(\w+)"\}} (\S+)$'
    for kind, label, value in re.findall(pattern, body, re.M):
        found.setdefault(label, [0.0, 0.0])[0 if kind == "count" else 1] = float(value)
    return {label: (count, total) for label, (count, total) in found.items()}


async def stream(c: Client, pcm: bytes) -> list[float]:
    """`pcm` in 20 ms pieces, paced at real time as a microphone sends it; when each send began
    (the loop's clock: time.monotonic, the gateway's too). Stamped after the send, a piece could
    reach the gateway (another process) before the client's stamp on a busy machine."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    sent = []
    for i, piece in enumerate(pieces(pcm)):
        sent.append(loop.time())  # before the send: the gateway cannot receive it sooner
        await c.send({"type": "input_audio_buffer.append", "audio": b64(piece)})
        await asyncio.sleep(max(0.0, start + (i + 1) * len(piece) / 2 / RATE - loop.time()))
    return sent


async def answered(c: Client) -> tuple[dict, float]:
    """The answer's response.done, and when its first audio delta came."""
    first_audio = None
    async with asyncio.timeout(60):
        while True:
            event = await c.next()
            if event["type"] == "response.output_audio.delta" and first_audio is None:
                first_audio = asyncio.get_running_loop().time()
            if event["type"] == "response.done":
                assert first_audio is not None, event
                return event["response"], first_audio


def test_each_spoken_turns_answer_records_its_voice_to_voice(gateway):
    """The gateway's voice-to-voice is within what the client saw: from sending the piece that held
    the end of speech to receiving the first audio delta (one clock: CLOCK_MONOTONIC)."""
    speech = speech_pcm16("Hello there, how are you?")
    vad = {"type": "server_vad", "silence_duration_ms": SILENCE_MS}

    async def turns() -> list[tuple[str, dict[str, tuple[float, float]], dict, float]]:
        """(label, histogram before, response, the client's voice-to-voice in ms) of each turn."""
        out = []
        async with connect(gateway, key=API_KEY) as ws:
            c = await opened(ws)
            audio = {"input": {"turn_detection": vad}}
            await c.send(
                {"type": "session.update", "session": {"type": "realtime", "audio": audio, **ANSWER}}
            )
            await c.until("session.updated")
            before = histogram(gateway)
            microphone = asyncio.create_task(stream(c, silence_pcm16(0.2) + speech + silence_pcm16(0.6)))
            try:
                response, heard = await answered(c)
            finally:
                sent = await microphone
            stopped = next(e for e in c.seen if e["type"] == "input_audio_buffer.speech_stopped")
            piece = stopped["audio_end_ms"] // 20 - 1  # the piece that held the end of speech
            out.append(("server_vad", before, response, (heard - sent[piece]) * 1000))

            audio = {"input": {"turn_detection": None}}
            await c.send({"type": "session.update", "session": {"type": "realtime", "audio": audio}})
            await c.until("session.updated")
            before = histogram(gateway)
            sent = await stream(c, speech)
            await c.send({"type": "input_audio_buffer.commit"})
            await c.send({"type": "response.create"})
            response, heard = await answered(c)
            out.append(("none", before, response, (heard - sent[-1]) * 1000))
        return out

    measured = asyncio.run(turns())
    after = histogram(gateway)
    for i, (label, before, response, client_ms) in enumerate(measured):
        ms = response["omnistream"]["voice_to_voice_ms"]
        assert ms is not None and 0 < ms <= client_ms + 1, (label, ms, client_ms)
        now = measured[i + 1][1] if i + 1 < len(measured) else after  # before the next turn
        (count, total), (was_count, was_total) = now[label], before.get(label, (0.0, 0.0))
        assert count == was_count + 1, (label, before, now)
        assert total - was_total == pytest.approx(ms / 1000, abs=0.001)
