"""The speech route's streams around a session that fails mid-answer, and its extension fields (the
route itself runs on real stages in tests/integration/test_gateway_speech.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import ValidationError

from gateway.config import GatewayConfig
from gateway.rest_speech import (
    SpeechRequest,
    SpeechStreamAborted,
    audio_stream,
    sse_stream,
    to_generation_request,
)
from omnistream.errors import Unavailable
from omnistream.request import AudioEvent


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


def _speech(**fields):
    core = SimpleNamespace(config=GatewayConfig(), deployment=SimpleNamespace(voices=None))
    return to_generation_request(SpeechRequest.model_validate({"input": "Hello.", **fields}), core)


def test_the_codec_chunk_schedule_extension_reaches_the_request():
    assert _speech().codec_chunk_schedule == "grow"
    assert _speech(codec_chunk_schedule="fixed").codec_chunk_schedule == "fixed"


def test_an_unknown_codec_chunk_schedule_is_refused_naming_the_field():
    with pytest.raises(ValidationError) as info:
        _speech(codec_chunk_schedule="doubling")
    assert [e["loc"] for e in info.value.errors()] == [("codec_chunk_schedule",)]
