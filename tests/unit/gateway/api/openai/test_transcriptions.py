"""`POST /v1/audio/transcriptions` through the official openai SDK against a core whose decoder is
the real one and whose thinker is scripted: each response_format, the stream, the request that
reaches the thinker, and the 400 naming the field for each kind of bad form (the route on real
stages is tests/integration/test_gateway_transcriptions.py)."""

from __future__ import annotations

import asyncio
import io
import wave
from types import SimpleNamespace

import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient
from openai import OpenAI
from starlette.requests import ClientDisconnect

from gateway.api.app import build_app
from gateway.api.openai.transcription_form import audio_mime
from gateway.api.openai.transcriptions import TranscriptStream, sse_events, unless_gone
from gateway.cluster.readiness import Readiness
from gateway.config import GatewayConfig
from gateway.media.decode_pool import MediaDecoder
from gateway.serving.core import GatewayCore
from gateway.serving.metrics import GatewayMetrics
from gateway.serving.transcription import Transcript, Transcription, transcription_request
from omnistream.request.defaults import ServingDefaults
from omnistream.request.errors import Overloaded, Unavailable
from omnistream.request.generation import DoneEvent, GenerationRequest, TextEvent
from omnistream.request.media import AudioInput
from tests.media_files import audio_file
from tests.unit.gateway.infos import deployment_taking

STAGES = {"thinker": ["a:1"], "talker": ["b:1"], "code2wav": ["c:1"]}
ROUTE = "/v1/audio/transcriptions"
DELTAS = ["Hello", " there", "."]


def wav_file(seconds: float = 1.5, rate: int = 16000) -> bytes:
    """A mono pcm16 WAV of a quiet tone (`seconds` exactly)."""
    t = np.arange(round(seconds * rate)) / rate
    samples = (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.tobytes())
    return buffer.getvalue()


class ScriptedSession:
    """The thinker's answer: `deltas`, then its summary (or `fail` after them)."""

    request_id = "t1"

    def __init__(self, deltas: list[str], fail: Exception | None = None) -> None:
        self.deltas, self.fail, self.closed = deltas, fail, False

    async def events(self):
        for i, delta in enumerate(self.deltas):
            yield TextEvent([i], delta)
        if self.fail is not None:
            raise self.fail
        yield DoneEvent([0] * 40, list(range(len(self.deltas))), "stop", 0, 0, None, None, 0.1)

    async def aclose(self) -> None:
        self.closed = True


class TranscribingCore(GatewayCore):
    """The real config, deployment checks and media decoder; `open` records the request and answers
    with a scripted session (or raises `refuse`)."""

    def __init__(self, modalities: tuple[str, ...] = ("text", "audio"), ready: bool = True) -> None:
        self.config = GatewayConfig(**STAGES)
        self.deployment = deployment_taking(modalities)
        self.metrics = GatewayMetrics()
        self.replicas = SimpleNamespace(snapshot=lambda: {})
        self.media = MediaDecoder(self.config.media_limits)
        self.opened: list[GenerationRequest] = []
        self.sessions: list[ScriptedSession] = []
        self.deltas, self.fail, self.refuse = list(DELTAS), None, None
        self._ready = ready

    @property
    def readiness(self) -> Readiness:
        return Readiness.of(lambda stage: self._ready)

    async def open(self, request, request_id=None, timeout=None, trace=None):
        self.validate(request)
        if self.refuse is not None:
            raise self.refuse
        self.opened.append(request)
        self.sessions.append(ScriptedSession(self.deltas, self.fail))
        return self.sessions[-1]


@pytest.fixture
def core():
    core = TranscribingCore()
    yield core
    core.media.close()


@pytest.fixture
def http(core):
    with TestClient(build_app(core), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def sdk(http) -> OpenAI:
    return OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)


def transcribe(sdk: OpenAI, **kwargs):
    return sdk.audio.transcriptions.create(
        **{"model": "whisper-1", "file": ("speech.wav", wav_file(), "audio/wav"), **kwargs}
    )


# --- answers -----------------------------------------------------------------------------------------
def test_json_is_the_text_and_the_transcript_s_usage(sdk, core):
    reply = transcribe(sdk)
    assert reply.text == "Hello there."
    usage = Transcript("Hello there.", 1.5, 40, 3, "stop").usage()  # of the 1.5 s file
    assert reply.usage is not None and reply.usage.model_dump(exclude_none=True) == usage
    assert core.sessions[0].closed


def test_the_thinker_gets_background_greedy_text_only_work_on_the_decoded_audio(sdk, core):
    transcribe(sdk, language="fr", prompt="Bonjour", temperature=0.7)
    (request,) = core.opened
    assert request.background and not request.return_audio
    assert request.sampling.temperature == 0.0  # the given temperature is not used
    audio, ask = request.messages[0]["content"]
    assert isinstance(audio["audio"], AudioInput) and audio["audio"].samples.size == 24000  # 1.5 s
    assert ask["text"].startswith("Transcribe the French audio into text.") and "Bonjour" in ask["text"]


@pytest.mark.parametrize("model", ["whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "qwen3-omni"])
def test_every_model_name_is_the_one_model(sdk, model):
    assert transcribe(sdk, model=model).text == "Hello there."


def test_verbose_json_is_one_segment_over_the_whole_audio(sdk):
    reply = transcribe(
        sdk, response_format="verbose_json", language="en", timestamp_granularities=["segment"]
    )
    assert (reply.text, reply.language, reply.duration) == ("Hello there.", "english", 1.5)
    (segment,) = reply.segments or []
    assert (segment.start, segment.end, segment.text) == (0.0, 1.5, "Hello there.")


@pytest.mark.parametrize(
    ("fmt", "body"),
    [
        ("text", "Hello there.\n"),
        ("srt", "1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n"),
        ("vtt", "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n"),
    ],
)
def test_text_formats_are_plain_text(sdk, fmt, body):
    assert transcribe(sdk, response_format=fmt) == body


def test_chunking_strategies_are_accepted_and_ignored(sdk):
    assert transcribe(sdk, chunking_strategy="auto").text == "Hello there."
    vad = {"type": "server_vad", "threshold": 0.4, "silence_duration_ms": 300, "prefix_padding_ms": 100}
    assert transcribe(sdk, chunking_strategy=vad).text == "Hello there."


@pytest.mark.parametrize(
    ("name", "content_type"), [("a.mp3", "audio/mpeg"), ("a.flac", None), ("a.ogg", None), ("a.m4a", None)]
)
def test_files_are_decoded_as_chat_s_input_audio(sdk, core, name, content_type):
    fmt = name.rsplit(".", 1)[1]
    data = audio_file(fmt, seconds=0.5)
    file = (name, data, content_type) if content_type else (name, data)
    assert transcribe(sdk, file=file).text == "Hello there."
    assert isinstance(core.opened[0].messages[0]["content"][0]["audio"], AudioInput)


def test_the_stream_is_openai_s_delta_and_done_events(sdk, core):
    events = list(transcribe(sdk, stream=True))
    assert [e.type for e in events] == ["transcript.text.delta"] * 3 + ["transcript.text.done"]
    assert [e.delta for e in events[:-1]] == DELTAS
    done = events[-1]
    assert done.text == "".join(DELTAS) and done.usage is not None and done.usage.total_tokens == 43
    assert core.sessions[0].closed


def test_a_transcript_without_text_streams_only_its_done_event(sdk, core):
    core.deltas = []
    events = list(transcribe(sdk, stream=True))
    assert [(e.type, e.text) for e in events] == [("transcript.text.done", "")]
    assert transcribe(sdk, response_format="srt") == ""


def test_a_failure_mid_stream_is_an_error_event(sdk, core):
    core.fail = Unavailable("the thinker went away")
    with pytest.raises(openai.APIError, match="the thinker went away"):
        list(transcribe(sdk, stream=True))
    assert core.sessions[0].closed


@pytest.mark.parametrize("stream", [False, True])
def test_a_refusal_before_any_text_is_its_http_status(sdk, core, stream):
    core.refuse = Overloaded("busy")
    with pytest.raises(openai.RateLimitError):
        transcribe(sdk, stream=stream)


def test_a_deployment_whose_thinker_takes_no_audio_refuses_with_400():
    core = TranscribingCore(modalities=("text",))
    with TestClient(build_app(core), raise_server_exceptions=False) as client:
        reply = client.post(ROUTE, data={"model": "whisper-1"}, files={"file": ("a.wav", wav_file())})
    core.media.close()
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "file" and "takes no audio input" in error["message"]
    assert not core.opened


def test_without_a_thinker_it_is_503():
    core = TranscribingCore(ready=False)
    with TestClient(build_app(core), raise_server_exceptions=False) as client:
        reply = client.post(ROUTE, data={"model": "whisper-1"}, files={"file": ("a.wav", wav_file())})
    core.media.close()
    assert reply.status_code == 503


# --- bad forms ---------------------------------------------------------------------------------------
WAV = ("a.wav", wav_file(), "audio/wav")


@pytest.mark.parametrize(
    ("data", "files", "param", "words"),
    [
        ({"model": "whisper-1"}, [], "file", "required"),
        ({"model": "whisper-1", "file": "not a file"}, [], "file", "file upload"),
        ({"model": "whisper-1"}, [("file", WAV), ("file", WAV)], "file", "one file"),
        ({"model": "whisper-1"}, [("file", ("a.wav", b"", "audio/wav"))], "file", "empty"),
        (
            {"model": "whisper-1"},
            [("file", ("a.wav", b"\x00garbage" * 64, "audio/wav"))],
            "file",
            "not a valid",
        ),
        ({"model": "whisper-1"}, [("file", ("a.bin", b"\x00garbage" * 64))], "file", "not a supported"),
        ({"model": "whisper-1"}, [("file", ("a.png", b"\x89PNG....", "image/png"))], "file", ""),
        ({}, [("file", WAV)], "model", "required"),
        ({"model": ""}, [("file", WAV)], "model", "at least 1"),
        ({"model": "m", "response_format": "diarized_json"}, [("file", WAV)], "response_format", "json"),
        ({"model": "m", "temperature": "hot"}, [("file", WAV)], "temperature", "number"),
        ({"model": "m", "temperature": "1.5"}, [("file", WAV)], "temperature", "less than or equal"),
        ({"model": "m", "stream": "maybe"}, [("file", WAV)], "stream", "boolean"),
        ({"model": "m", "stream": "true", "response_format": "srt"}, [("file", WAV)], "stream", "srt"),
        (
            {"model": "m", "timestamp_granularities[]": "word"},
            [("file", WAV)],
            "timestamp_granularities",
            "word",
        ),
        ({"model": "m", "timestamp_granularities[]": "line"}, [("file", WAV)], "timestamp_granularities", ""),
        ({"model": "m", "include[]": "logprobs"}, [("file", WAV)], "include", "logprobs"),
        ({"model": "m", "language": "english"}, [("file", WAV)], "language", "ISO-639"),
        ({"model": "m", "keywords[]": "sea"}, [("file", WAV)], "keywords", "not supported"),
        ({"model": "m", "voice": "ethan"}, [("file", WAV)], "voice", "unknown field"),
        ({"model": "m", "prompt": ["a", "b"]}, [("file", WAV)], "prompt", "more than once"),
        ({"model": "m"}, [("file", WAV), ("prompt", WAV)], "prompt", "text field"),
        ({"model": "m", "chunking_strategy": "manual"}, [("file", WAV)], "chunking_strategy", "auto"),
        (
            {"model": "m", "chunking_strategy[type]": "server_vad", "chunking_strategy[threshold]": "2"},
            [("file", WAV)],
            "chunking_strategy.threshold",
            "less than or equal",
        ),
        (
            {"model": "m", "chunking_strategy": '{"type": "semantic"}'},
            [("file", WAV)],
            "chunking_strategy.type",
            "",
        ),
    ],
)
def test_a_bad_form_is_a_400_naming_the_field(http, core, data, files, param, words):
    reply = http.post(ROUTE, data=data, files=files or None)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"
    assert not core.opened


def test_the_sdk_raises_bad_request_naming_word_timestamps(sdk):
    with pytest.raises(openai.BadRequestError) as refused:
        transcribe(sdk, response_format="verbose_json", timestamp_granularities=["segment", "word"])
    assert refused.value.param == "timestamp_granularities"


def test_a_body_that_is_not_multipart_is_a_400_naming_the_file(http):
    reply = http.post(ROUTE, json={"model": "whisper-1", "file": "x"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "file"
    reply = http.post(
        ROUTE, content=b"--x\r\nbroken", headers={"Content-Type": "multipart/form-data; boundary=x"}
    )
    assert reply.status_code == 400, reply.text


def test_a_file_over_the_media_limit_is_a_413_naming_it():
    core = TranscribingCore()
    core.config = GatewayConfig(**STAGES, max_media_bytes=4096)
    core.media.close()
    core.media = MediaDecoder(core.config.media_limits)
    with TestClient(build_app(core), raise_server_exceptions=False) as client:
        reply = client.post(ROUTE, data={"model": "m"}, files={"file": ("a.wav", wav_file(), "audio/wav")})
    core.media.close()
    assert reply.status_code == 413 and reply.json()["error"]["param"] == "file"


@pytest.mark.parametrize(
    ("content_type", "filename", "mime"),
    [
        ("audio/wav", "x.mp3", "audio/wav"),  # the declared type first
        ("audio/x-wav", None, "audio/x-wav"),
        ("video/webm", "talk.webm", "audio/webm"),  # not audio/*: the extension's
        ("application/octet-stream", "a.MP3", "audio/mpeg"),
        (None, "a.mpga", "audio/mpeg"),
        (None, "speech", ""),  # sniffed
    ],
)
def test_the_file_s_type_is_its_audio_content_type_or_its_extension_s(content_type, filename, mime):
    assert audio_mime(content_type, filename) == mime


# --- a client that leaves ----------------------------------------------------------------------------
def _leaving_request(after: float):
    async def receive():
        await asyncio.sleep(after)
        return {"type": "http.disconnect"}

    return SimpleNamespace(receive=receive)


async def test_a_client_that_leaves_first_cancels_the_work():
    cancelled = asyncio.Event()

    async def forever():
        try:
            await asyncio.sleep(60)
        finally:
            cancelled.set()

    assert await unless_gone(forever(), _leaving_request(0.01)) is None
    assert cancelled.is_set()
    done = await unless_gone(asyncio.sleep(0, "ok"), _leaving_request(60))
    assert done is not None and done.result() == "ok"


async def test_a_stream_cancelled_before_its_first_byte_still_ends_the_transcription(core):
    """A response cancelled before its body started never runs the body's `finally`: the
    TranscriptStream closes the deltas (and so the session) itself."""
    audio = {"type": "audio", "audio": AudioInput(np.zeros(1600, np.float32))}
    request = transcription_request(audio, 0.1, ServingDefaults.of(core.config))
    transcription = Transcription(core, request, 0.1)
    deltas = transcription.deltas()
    assert await anext(deltas) == "Hello"
    response = TranscriptStream(deltas, sse_events("Hello", deltas, transcription))

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        raise OSError("the client is gone")

    with pytest.raises(ClientDisconnect):  # the response start could not be sent: no body ran
        await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
    assert core.sessions[0].closed


def test_the_openapi_document_describes_the_form(http):
    spec = http.get("/openapi.json").json()
    body = spec["paths"][ROUTE]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert body["required"] == ["file", "model"]
    assert body["properties"]["file"]["format"] == "binary"
    assert body["properties"]["response_format"]["enum"] == ["json", "text", "srt", "verbose_json", "vtt"]
