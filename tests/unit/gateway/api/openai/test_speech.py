"""The speech route's streams around a session that fails mid-answer, and its extension fields (the
route itself runs on real stages in tests/integration/test_gateway_speech.py)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import ValidationError

from gateway.api.openai.speech import (
    SpeechRequest,
    SpeechStreamAborted,
    audio_stream,
    primed,
    sse_stream,
    to_generation_request,
)
from gateway.config import GatewayConfig
from omnistream.audio.wav import to_pcm16
from omnistream.request.errors import InvalidRequest, Unavailable
from omnistream.request.generation import AudioEvent, DoneEvent, TextEvent


class _FailingSession:
    """One audio event, then the stage behind it fails."""

    request_id = "r1"

    def __init__(self) -> None:
        self.closed = False

    async def events(self):
        yield AudioEvent(np.zeros(2400, dtype=np.float32), 0, 24000)
        raise Unavailable("talker went away")

    async def aclose(self) -> None:
        self.closed = True


async def test_a_byte_stream_that_fails_midway_is_aborted_not_ended():
    session = _FailingSession()
    received = []
    with pytest.raises(SpeechStreamAborted, match="talker went away"):
        async for chunk in audio_stream(session, "pcm", 24000):
            received.append(chunk)
    assert b"".join(received) == bytes(4800)  # what came before the failure was sent
    assert session.closed


async def test_an_sse_stream_that_fails_midway_ends_with_an_error_event():
    session = _FailingSession()
    events = [json.loads(line[6:]) async for line in sse_stream(session, "pcm", 24000)]
    assert events[0]["type"] == "speech.audio.delta"
    assert events[-1]["error"]["message"] == "talker went away"
    assert session.closed


def _speech(voices=None, **fields):
    deployment = SimpleNamespace(voices=voices, default_voice="ethan" if voices else None)
    core = SimpleNamespace(config=GatewayConfig(), deployment=deployment)
    return to_generation_request(SpeechRequest.model_validate({"input": "Hello.", **fields}), core)


def test_openai_voice_names_are_spoken_by_the_models_voices_as_in_realtime():
    voices = ("chelsie", "ethan", "aiden")
    assert _speech(voices, voice="alloy").speaker == "chelsie"
    assert _speech(voices, voice={"id": "onyx"}).speaker == "aiden"
    assert _speech(voices, voice="aiden").speaker == "aiden"
    assert _speech(voices, voice="nobody").speaker == "nobody"  # the core's voice check refuses it


def test_the_codec_chunk_schedule_extension_reaches_the_request():
    assert _speech().codec_chunk_schedule == "grow"
    assert _speech(codec_chunk_schedule="fixed").codec_chunk_schedule == "fixed"


def test_an_unknown_codec_chunk_schedule_is_refused_naming_the_field():
    with pytest.raises(ValidationError) as info:
        _speech(codec_chunk_schedule="doubling")
    assert [e["loc"] for e in info.value.errors()] == [("codec_chunk_schedule",)]


class _Session:
    """`events` as given; records whether it was closed."""

    request_id = "r2"

    def __init__(self, events) -> None:
        self._events = events
        self.closed = False

    async def events(self):
        for event in self._events:
            if isinstance(event, BaseException):
                raise event
            if event == "wait":
                await asyncio.sleep(3600)
            yield event

    async def aclose(self) -> None:
        self.closed = True


class _Client:
    """The ASGI `receive` of a client that stays, or that leaves at once."""

    def __init__(self, leaves: bool) -> None:
        self.leaves = leaves

    async def receive(self) -> dict:
        if self.leaves:
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)
        return {}


async def test_a_failure_before_the_first_audio_is_raised_before_any_byte():
    """Issue 28: it becomes the route's HTTP status and JSON body, not a dropped connection."""
    session = _Session([InvalidRequest("talker: the prompt has no turn")])
    with pytest.raises(InvalidRequest, match="no turn"):
        await primed(session, "pcm", 24000, _Client(leaves=False))
    assert session.closed


async def test_a_primed_answer_streams_its_first_piece_then_the_rest():
    audio = AudioEvent(np.ones(2400, dtype=np.float32) * 0.5, 0, 24000)
    done = DoneEvent([1], [2], "stop", frames=1, audio_samples=4800, ttft=None, ttfp=None, e2e=0.1)
    session = _Session([TextEvent([2], "hi"), audio, audio, done])
    items = await primed(session, "pcm", 24000, _Client(leaves=False))
    assert items is not None and not session.closed
    received = b"".join([chunk async for chunk in audio_stream(session, "pcm", 24000, items)])
    assert received == to_pcm16(np.concatenate([audio.audio, audio.audio]))
    assert session.closed


async def test_a_client_leaving_before_the_first_audio_closes_the_session():
    session = _Session([TextEvent([2], "hi"), "wait"])
    assert await primed(session, "wav", 24000, _Client(leaves=True)) is None
    assert session.closed
