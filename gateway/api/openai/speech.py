"""`POST /v1/audio/speech`: OpenAI's text-to-speech API, spoken by the talker.

The thinker does not answer: the request's `input` is the assistant's answer (ThinkerOpen's
`assistant_text`), streamed through the same chunk path as a generated one, so the talker and
code2wav run unchanged. The prompt the talker is conditioned on is one user turn holding the same
text: the talker reads the user's words as context, and the words to speak are those of the answer.

What differs from OpenAI, and why:

* `speed` must be 1.0 (the model has no tempo control, and stretching the audio after the fact is
  not what a client asking for speed gets from OpenAI); any other value is refused (422, the
  error table's invalid_request, as every invalid field here).
* `instructions` are refused when non-empty: the talker is conditioned only on the user turn and
  the answer, so a style instruction would be silently ignored.
* `voice` is one of the deployment's voices (`/v1/models` via the talker's Info; e.g. ethan,
  chelsie, aiden) or one of OpenAI's names, spoken by the model's nearest voice (the table in
  gateway/api/openai/voices.py, the same as `/v1/realtime`'s); a string or `{"id": ...}`; left
  out, the model's default voice (ethan on Qwen3-Omni, as the talker's Info says).
* `usage` on `speech.audio.done` counts `input_tokens` as the prompt's tokens and `output_tokens`
  as the 80 ms codec frames spoken.
* Extensions (not OpenAI's): `seed`, `talker_temperature`, `talker_top_k`, `talker_top_p`,
  `talker_repetition_penalty`, `max_audio_frames`, `initial_codec_chunk_frames`,
  `codec_chunk_schedule`, `timeout`.

Errors: the status line waits for the first piece of the file (or of the SSE stream), so a request
that fails before any audio (a stage refusing it, a timeout) gets its HTTP status and the JSON error
body, as every other endpoint answers. Only a failure after audio went out aborts the body.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from gateway.api.openai import sse
from gateway.api.openai.audio_encode import MEDIA_TYPES, AudioEncoder, encoder
from gateway.api.openai.errors import COMMON_RESPONSES, ErrorResponse, error_body, error_response
from gateway.api.openai.request_guards import first_invalid_unicode, printable
from gateway.api.openai.sse import SessionStream
from gateway.api.openai.voices import speaker_for
from gateway.serving.core import GatewayCore
from gateway.serving.session import Session
from gateway.serving.tracing import http_entry
from omnistream.request.defaults import DEFAULTS, RequestInput, ServingDefaults, resolve
from omnistream.request.errors import InvalidRequest, OmniError, Unavailable, status_of
from omnistream.request.generation import AudioEvent, DoneEvent, GenerationRequest

log = logging.getLogger(__name__)

STRICT = ConfigDict(extra="forbid", strict=True)
Name = Annotated[str, Field(max_length=256)]
MAX_INPUT_CHARS = 4096  # OpenAI's limit


class VoiceId(BaseModel):
    model_config = STRICT
    id: Name


class SpeechRequest(BaseModel):
    """OpenAI's speech request, plus omnistream's own knobs (marked as extensions)."""

    model_config = STRICT
    model: Name | None = None
    input: Annotated[str, Field(min_length=1, max_length=MAX_INPUT_CHARS)]
    voice: Name | VoiceId | None = Field(
        None,
        description="One of the model's speakers, or an OpenAI voice name (its nearest speaker); "
        "default: the model's default voice (ethan on Qwen3-Omni).",
    )
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = Field(
        "mp3", description="pcm: raw 16-bit LE 24 kHz mono; wav streams with its header first."
    )
    speed: float = Field(1.0, description="Only 1.0: the model has no tempo control.")
    instructions: str | None = Field(None, description="Not supported: refused unless empty.")
    stream_format: Literal["audio", "sse"] = Field(
        "audio",
        description="audio: the file's bytes as they are decoded; sse: speech.audio.delta events "
        "(base64 of the same bytes) and a speech.audio.done with usage.",
    )
    # extensions
    seed: int | None = Field(None, ge=0, lt=2**63, description="Extension: seeds the voice sampling.")
    talker_temperature: float | None = Field(
        None, ge=0.0, le=2.0, description=f"Extension: default {DEFAULTS.talker_temperature}; 0 = greedy."
    )
    talker_top_k: int | None = Field(None, ge=0, description="Extension.")
    talker_top_p: float | None = Field(None, gt=0.0, le=1.0, description="Extension.")
    talker_repetition_penalty: float | None = Field(None, gt=0.0, le=10.0, description="Extension.")
    max_audio_frames: int | None = Field(None, ge=1, description="Extension: at most this many 80 ms frames.")
    initial_codec_chunk_frames: int | None = Field(None, ge=1, le=25, description="Extension.")
    codec_chunk_schedule: Literal["grow", "fixed"] | None = Field(
        None, description=f"Extension: default {DEFAULTS.codec_chunk_schedule} (as for chat completions)."
    )
    timeout: float | None = Field(None, gt=0.0, description="Extension: seconds before a 504.")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode_everywhere(cls, data: Any) -> Any:
        """A lone surrogate anywhere is a 422 naming its path (as for chat completions)."""
        path = first_invalid_unicode(data)
        if path is None:
            return data
        error = PydanticCustomError("invalid_unicode", "string is not valid Unicode (a lone surrogate)")
        loc = tuple(printable(p) if isinstance(p, str) else p for p in path)
        raise ValidationError.from_exception_data(
            cls.__name__, [InitErrorDetails(type=error, loc=loc, input="(not valid Unicode)")]
        )


def to_generation_request(body: SpeechRequest, core: GatewayCore) -> GenerationRequest:
    """The speech request as a generation: the input is both the user turn and the given answer.
    Its token budget is the deployment's limit (not the chat default), so any text that fits the
    model is spoken; the thinker refuses one that does not, before any audio."""
    if body.speed != 1.0:
        raise InvalidRequest("speed: only 1.0 is supported (the model has no tempo control)", field="speed")
    if body.instructions:
        raise InvalidRequest(
            "instructions: not supported (the voice is conditioned on the text only)", field="instructions"
        )
    serving = ServingDefaults.of(core.config, core.deployment.voices, core.deployment.default_voice)
    voice = body.voice.id if isinstance(body.voice, VoiceId) else body.voice
    if voice is not None:
        voice = speaker_for(voice, serving.voices, serving.voice)
    given = RequestInput(
        messages=[{"role": "user", "content": body.input}],
        assistant_text=body.input,
        max_tokens=core.config.max_tokens_limit,
        return_audio=True,
        voice=voice,
        seed=body.seed,
        max_audio_frames=body.max_audio_frames,
        talker_temperature=body.talker_temperature,
        talker_top_p=body.talker_top_p,
        talker_top_k=body.talker_top_k,
        talker_repetition_penalty=body.talker_repetition_penalty,
        initial_codec_chunk_frames=body.initial_codec_chunk_frames,
        codec_chunk_schedule=body.codec_chunk_schedule,
    )
    return resolve(given, serving)


def _usage(done: DoneEvent) -> dict[str, int]:
    return {
        "input_tokens": len(done.prompt_ids),
        "output_tokens": done.frames,
        "total_tokens": len(done.prompt_ids) + done.frames,
    }


async def _encoded(session: Session, fmt: str, sample_rate: int) -> AsyncGenerator[bytes | DoneEvent, None]:
    """The file's bytes as the audio is decoded (encoding in a worker thread), then the DoneEvent.
    `sample_rate`: the deployment's, for a file without samples; audio events carry their own."""
    enc: AudioEncoder | None = None
    async for event in session.events():
        if isinstance(event, AudioEvent):
            if enc is None:
                enc = await asyncio.to_thread(encoder, fmt, event.sample_rate)
            data = await asyncio.to_thread(enc.write, event.audio)
            if data:
                yield data
        elif isinstance(event, DoneEvent):
            if enc is None:
                enc = await asyncio.to_thread(encoder, fmt, sample_rate)
            tail = await asyncio.to_thread(enc.close)
            if tail:
                yield tail
            yield event


Item = bytes | DoneEvent


async def _chained(first: Item, rest: AsyncGenerator[Item, None]) -> AsyncGenerator[Item, None]:
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await rest.aclose()


async def until_disconnected(request: Request) -> None:
    """Returns once the client has gone (the body is read by now: nothing else can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def primed(
    session: Session, fmt: str, sample_rate: int, request: Request | None = None
) -> AsyncGenerator[Item, None] | None:
    """The encoded answer with its first piece already there, read before any byte is sent, so
    that a failure before it is the route's HTTP error (raised here as the OmniError) instead of a
    dropped connection. None when the client left first (`request`): the session is closed then."""
    items = _encoded(session, fmt, sample_rate)
    first = asyncio.ensure_future(anext(items))
    gone = asyncio.ensure_future(until_disconnected(request)) if request is not None else None
    left = True  # until the first piece is there
    try:
        await asyncio.wait([t for t in (first, gone) if t is not None], return_when=asyncio.FIRST_COMPLETED)
        left = not first.done()
        if not left:
            return _chained(first.result(), items)
        return None
    except BaseException:  # the OmniError of a request that failed before its first piece
        left = True
        raise
    finally:
        if gone is not None:
            gone.cancel()
            with contextlib.suppress(BaseException):
                await gone
        if left:  # the client left, this handler was cancelled, or the request failed
            first.cancel()
            with contextlib.suppress(BaseException):
                await first
            await items.aclose()
            await session.aclose()


class SpeechStreamAborted(RuntimeError):
    """A byte stream that failed after its headers: raised through the server so the connection
    ends without the final chunk."""


async def audio_stream(
    session: Session, fmt: str, sample_rate: int, items: AsyncIterator[Item] | None = None
) -> AsyncIterator[bytes]:
    """`items`: the answer from `primed` (else it is read here, and a failure before any audio
    aborts the body like any other)."""
    try:
        async for item in items if items is not None else _encoded(session, fmt, sample_rate):
            if isinstance(item, bytes):
                yield item
    except OmniError as exc:
        # The status line is gone, so the error cannot be a status: the body is aborted instead (the
        # server drops the connection without the last chunk), which clients report as an
        # incomplete response rather than take a shortened file for the whole answer.
        log.warning("speech %s failed mid-stream: %s (%s)", session.request_id, exc.message, exc.kind)
        raise SpeechStreamAborted(f"speech {session.request_id}: {exc.message}") from exc
    finally:
        await session.aclose()


async def sse_stream(
    session: Session, fmt: str, sample_rate: int, items: AsyncIterator[Item] | None = None
) -> AsyncIterator[str]:
    try:
        async for item in items if items is not None else _encoded(session, fmt, sample_rate):
            if isinstance(item, bytes):
                yield sse.event({"type": "speech.audio.delta", "audio": base64.b64encode(item).decode()})
            else:
                yield sse.event({"type": "speech.audio.done", "usage": _usage(item)})
    except OmniError as exc:
        status = status_of(exc).http_status
        yield sse.event(error_body(status, exc.message, exc.kind, exc.field))
    finally:
        await session.aclose()


def router(core: GatewayCore) -> APIRouter:
    """The endpoint over `core`; every stage is needed (the talker speaks, code2wav decodes)."""
    api = APIRouter()

    @api.post(
        "/v1/audio/speech",
        summary="Text to speech (OpenAI's speech API): the talker speaks `input`",
        response_class=Response,
        responses={
            200: {
                "description": "The audio file's bytes as they are decoded, or with stream_format=sse "
                "an SSE stream of speech.audio.delta / speech.audio.done",
                "content": {**{t: {} for t in MEDIA_TYPES.values()}, "text/event-stream": {}},
            },
            401: {"model": ErrorResponse, "description": "Missing or wrong API key (when one is set)"},
            422: {
                "model": ErrorResponse,
                "description": "Invalid request (`param` names the field): also a speed other than 1.0, "
                "instructions, or a text over the token limit",
            },
            413: {"model": ErrorResponse, "description": "Body over max_request_bytes"},
            **COMMON_RESPONSES,
            500: {"model": ErrorResponse, "description": "A stage failed before any audio was sent"},
        },
    )
    async def speech(body: SpeechRequest, http_request: Request) -> Response:
        core.readiness.require(audio=True)  # speech needs every stage
        # The code2wav's, which a ready deployment knows; without it there is no file to write.
        rate = core.deployment.sample_rate
        if not rate:
            raise Unavailable("no code2wav has reported its sample rate: audio cannot be served now")
        try:
            request = to_generation_request(body, core)
            trace = http_entry("POST", "/v1/audio/speech", http_request.headers)
            session = await core.open(request, timeout=body.timeout, trace=trace)
            items = await primed(session, body.response_format, rate, http_request)
        except OmniError as exc:
            return error_response(exc)  # as named here (the app's handler renames chat fields)
        if items is None:  # the client left before any audio: nobody reads an answer
            return Response(status_code=204)
        headers = {"Cache-Control": "no-cache", "X-Request-Id": session.request_id}
        if body.stream_format == "sse":
            return SessionStream(
                session,
                sse_stream(session, body.response_format, rate, items),
                media_type="text/event-stream",
                headers=headers,
            )
        return SessionStream(
            session,
            audio_stream(session, body.response_format, rate, items),
            media_type=MEDIA_TYPES[body.response_format],
            headers=headers,
        )

    return api
