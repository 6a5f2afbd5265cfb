"""/v1/realtime end to end with the official openai SDK's realtime client, on the real processes:
speech rendered by espeak-ng, streamed in 20 ms pieces at real time, found by the server VAD,
answered with text and audio deltas; a second turn that uses the history; a barge-in."""

from __future__ import annotations

import asyncio
import base64

import pytest
from openai import AsyncOpenAI

from tests.integration.conftest import configured_gateway, gateway_idle, gateway_url, metric_at, wait_for
from tests.speech import pieces, silence_pcm16, speech_pcm16

API_KEY = "realtime-test-key"
VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 200, "silence_duration_ms": 400}


@pytest.fixture(scope="module")
def gateway(stages, tmp_path_factory):
    with configured_gateway(stages, tmp_path_factory.mktemp("realtime"), {"api_key": API_KEY}) as gw:
        yield gw


def client(gateway) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{gateway_url(gateway)}/v1", api_key=API_KEY)


async def speak(conn, pcm: bytes, trailing_silence: float = 0.8) -> None:
    """Send speech then silence in 20 ms pieces, paced at real time like a microphone."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i, piece in enumerate(pieces(silence_pcm16(0.2) + pcm + silence_pcm16(trailing_silence))):
        await conn.input_audio_buffer.append(audio=base64.b64encode(piece).decode())
        delay = start + (i + 1) * 0.02 - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)


async def events_until(conn, kind: str, seen: list, timeout: float = 120.0):
    """Collect events into `seen` until one of type `kind` arrives; returns it."""
    async with asyncio.timeout(timeout):
        async for event in conn:
            seen.append(event)
            if event.type == kind:
                return event
    raise AssertionError(f"the connection closed before {kind}")


def types(seen: list) -> list[str]:
    return [e.type for e in seen]


async def spoken_turn(conn, text: str) -> tuple[list, object]:
    """Speak `text` while reading events; returns all events up to response.done, and it."""
    seen: list = []
    speaker = asyncio.create_task(speak(conn, speech_pcm16(text)))
    try:
        done = await events_until(conn, "response.done", seen)
    finally:
        await speaker
    return seen, done


def finished(done) -> bool:
    """Ended normally: completed, or cut at max_output_tokens (the tiny random model rarely stops)."""
    response = done.response
    if response.status == "incomplete":
        return response.status_details.reason == "max_output_tokens"
    return response.status == "completed"


def test_spoken_turns_use_vad_and_history(gateway, stages):
    async def run():
        async with client(gateway).realtime.connect(model="omnistream") as conn:
            created = await conn.recv()
            assert created.type == "session.created"
            await conn.session.update(
                session={
                    "type": "realtime",
                    "instructions": "You are a helpful assistant.",
                    "output_modalities": ["audio"],
                    "audio": {
                        "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": VAD}
                    },
                    "max_output_tokens": 12,
                    "omnistream": {"seed": 1, "max_audio_frames": 30},
                }
            )
            updated = await conn.recv()
            assert updated.type == "session.updated", updated
            assert updated.session.audio.input.turn_detection.silence_duration_ms == 400

            first, done1 = await spoken_turn(conn, "Hello, can you tell me what time it is?")
            kinds = types(first)
            for kind in (
                "input_audio_buffer.speech_started",
                "input_audio_buffer.speech_stopped",
                "input_audio_buffer.committed",
                "conversation.item.added",
                "response.created",
                "response.output_audio_transcript.delta",
                "response.output_audio.delta",
                "response.output_audio.done",
                "response.output_audio_transcript.done",
            ):
                assert kind in kinds, (kind, kinds)
            assert kinds.index("input_audio_buffer.speech_started") < kinds.index(
                "input_audio_buffer.committed"
            )
            assert kinds.index("response.created") < kinds.index("response.output_audio.delta")
            assert finished(done1), done1.response
            usage1 = done1.response.usage
            assert usage1.input_tokens > 0 and usage1.output_tokens > 0
            audio = b"".join(
                base64.b64decode(e.delta) for e in first if e.type == "response.output_audio.delta"
            )
            assert len(audio) > 0 and len(audio) % 2 == 0
            extra = done1.response.model_extra["omnistream"]
            assert extra["ttft_ms"] > 0 and extra["ttfa_ms"] > 0 and extra["rtf"] > 0
            assert set(extra["replicas"]) == {"thinker", "talker", "code2wav"}
            # What a listener heard of the spoken answer (omnistream/audio/listener.py).
            assert extra["stalls"] >= 0 and extra["underrun_ms"] >= 0 and extra["stall_ms"] >= 0
            assert isinstance(extra["continuity_ok"], bool)

            _, done2 = await spoken_turn(conn, "Hello, can you tell me what time it is?")
            assert finished(done2), done2.response
            # The same words again: the prompt grew by the first turn (its audio and the answer).
            assert done2.response.usage.input_tokens > usage1.input_tokens + usage1.output_tokens - 1
            # ... and starts with the first turn's whole prompt, which the thinker kept (its audio too).
            assert done2.response.usage.input_token_details.cached_tokens >= usage1.input_tokens

    asyncio.run(run())
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), 10))


def test_barge_in_cancels_every_stage(gateway, stages):
    async def run():
        async with client(gateway).realtime.connect(model="omnistream") as conn:
            await conn.recv()
            await conn.session.update(
                session={
                    "type": "realtime",
                    "audio": {"input": {"turn_detection": VAD}},
                    "max_output_tokens": 1000,
                    "omnistream": {"ignore_eos": True, "seed": 2},
                }
            )
            seen: list = []
            speaker = asyncio.create_task(speak(conn, speech_pcm16("Please tell me a very long story.")))
            await events_until(conn, "response.output_audio.delta", seen)
            await speaker
            interrupt = asyncio.create_task(speak(conn, speech_pcm16("Stop, stop please.")))
            try:
                started = await events_until(conn, "input_audio_buffer.speech_started", seen)
                done = await events_until(conn, "response.done", seen)
            finally:
                interrupt.cancel()
            assert done.response.status == "cancelled", done.response
            assert done.response.status_details.reason == "turn_detected"
            item_id = done.response.output[0].id
            # None of its audio follows speech_started, and the item keeps exactly the audio sent.
            after = seen[next(i for i, e in enumerate(seen) if e is started) :]
            assert not [e for e in after if e.type == "response.output_audio.delta"]
            received = sum(
                len(base64.b64decode(e.delta))
                for e in seen
                if e.type == "response.output_audio.delta" and e.item_id == item_id
            )
            truncated = [e for e in seen if e.type == "conversation.item.truncated"]
            assert truncated and truncated[0].item_id == item_id
            assert truncated[0].audio_end_ms == received // 2 * 1000 // 24000 > 0
            # Every stage is idle while the session is still open.
            assert await wait_for(lambda: gateway_idle(gateway, stages), 10)
            assert metric_at(f"{gateway_url(gateway)}/metrics", "omnistream_realtime_barge_ins_total") >= 1

    asyncio.run(run())
