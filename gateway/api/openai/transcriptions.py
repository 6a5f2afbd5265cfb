"""`POST /v1/audio/transcriptions`: OpenAI's speech-to-text API, transcribed by the thinker itself.

The form's `file` (gateway/api/openai/transcription_form.py) is decoded by the gateway's media
decoder (the threads and limits of chat's `input_audio`), then transcribed as background work
(gateway/serving/transcription.py): greedy, text only, and stepped by the thinker only when none of
its other requests can, so a transcription never makes a spoken answer wait (it waits for them).

What differs from OpenAI, and why:

* `model` is required, as OpenAI's; whatever it names (whisper-1, gpt-4o-transcribe,
  gpt-4o-mini-transcribe, ..., this deployment's model id) the one model transcribes.
* `temperature` (0 to 1) is accepted and not used: the transcription is greedy.
* verbose_json, srt and vtt: the model gives no timestamps, so the transcript is one segment from
  0 to the audio's duration (gateway/api/openai/transcript_formats.py).
* `timestamp_granularities[]`: `segment` is accepted (that one segment); `word` is refused, as is
  `include[]` (`logprobs`): the model gives neither word timings nor log-probs.
* `chunking_strategy` (`auto` or a `server_vad` object) is accepted and ignored: the file is
  transcribed as one block.
* `stream=true` (json and text): `transcript.text.delta` events, then `transcript.text.done` with
  the text and the thinker's token usage; a failure after the status line is an `{"error": ...}` event.
* Every refused field is a 400 naming it (OpenAI's status for a bad transcription request, the
  SDK's BadRequestError): the project's 422 `invalid_request` (a file that does not decode, say)
  is a 400 `invalid_value` here. A file over the gateway's media limits is a 413.

A client that leaves before the answer (or, streaming, before its first delta) ends the
transcription at once; one that leaves mid-stream ends it as the stream is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from gateway.api.openai import sse
from gateway.api.openai.errors import COMMON_RESPONSES, ErrorResponse, error_body, error_response
from gateway.api.openai.speech import until_disconnected
from gateway.api.openai.transcript_formats import JSON_FORMATS, TEXT_MEDIA_TYPE, rendered, token_usage
from gateway.api.openai.transcription_form import OPENAPI_BODY, TranscriptionForm, read_form
from gateway.media.parts import EncodedMedia
from gateway.serving.core import GatewayCore
from gateway.serving.request_checks import check_message_size
from gateway.serving.tracing import http_entry
from gateway.serving.transcription import Transcription, transcription_request
from omnistream.request.defaults import ServingDefaults
from omnistream.request.errors import InternalError, InvalidValue, OmniError, status_of

ROUTE = "/v1/audio/transcriptions"
T = TypeVar("T")

RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "json and verbose_json (application/json); text, srt and vtt (text/plain); with "
        "stream=true an SSE stream of transcript.text.delta events and a transcript.text.done",
        "content": {"application/json": {}, "text/plain": {}, "text/event-stream": {}},
    },
    400: {"model": ErrorResponse, "description": "Invalid request (`param` names the field)"},
    401: {"model": ErrorResponse, "description": "Missing or wrong API key (when one is set)"},
    413: {
        "model": ErrorResponse,
        "description": "A file over the media limits, a body over max_request_bytes",
    },
    **COMMON_RESPONSES,
}


def as_answered(exc: OmniError) -> OmniError:
    """The project's 422 for a bad field is OpenAI's 400 here (the same message and field)."""
    return InvalidValue(exc.message, field=exc.field) if status_of(exc).http_status == 422 else exc


async def prepared(core: GatewayCore, http_request: Request) -> tuple[TranscriptionForm, Transcription]:
    """The form's fields and the transcription of its file (not started yet)."""
    data, mime, fields = await read_form(http_request)
    core.readiness.require(audio=False)  # a thinker is all it needs
    modalities = core.deployment.input_modalities
    if modalities is not None and "audio" not in modalities:
        raise InvalidValue(
            f"this deployment's model takes no audio input (its thinker accepts: {', '.join(modalities)}), "
            "so it cannot transcribe",
            field="file",
        )
    part: dict[str, Any] = {"type": "audio", "audio": EncodedMedia("audio", mime, "file", data=data)}
    size = await core.media.decode([{"role": "user", "content": [part]}], use_audio_in_video=False)
    seconds = float(part["audio"].seconds)
    defaults = ServingDefaults.of(core.config, core.deployment.voices, core.deployment.default_voice)
    request = transcription_request(part, seconds, defaults, fields.language, fields.prompt)
    check_message_size(request, size, core.config.max_message_bytes)  # as core.prepare would
    trace = http_entry("POST", ROUTE, http_request.headers)
    return fields, Transcription(core, request, seconds, trace)


async def unless_gone(work: Awaitable[T], request: Request) -> asyncio.Future[T] | None:
    """`work` run to its end (its future: `result()` is its value or raises its error), or None
    when the client left first (`work` is cancelled then)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_disconnected(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        return task if task.done() else None
    finally:
        for pending in (gone, task):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending


def _delta(text: str) -> str:
    return sse.event({"type": "transcript.text.delta", "delta": text}, ascii_only=False)


async def sse_events(
    first: str | None, deltas: AsyncGenerator[str, None], transcription: Transcription
) -> AsyncIterator[str]:
    """`first` (None: the transcript has no text) and the deltas after it, then the done event."""
    try:
        if first is not None:
            yield _delta(first)
            async for delta in deltas:
                yield _delta(delta)
        transcript = transcription.transcript
        if transcript is None:
            raise InternalError("the transcription ended without its summary")
        done = {"type": "transcript.text.done", "text": transcript.text, "usage": token_usage(transcript)}
        yield sse.event(done, ascii_only=False)
    except OmniError as exc:
        yield sse.event(error_body(status_of(exc).http_status, exc.message, exc.kind, exc.field))
    finally:
        await deltas.aclose()


class TranscriptStream(StreamingResponse):
    """As sse.SessionStream: the deltas (which hold the session) are closed however the client
    leaves, also before the body's generator ever started."""

    def __init__(self, deltas: AsyncGenerator[str, None], content: Any, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.deltas = deltas

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.deltas.aclose()


async def streamed(transcription: Transcription, http_request: Request) -> Response:
    """The SSE answer, its first delta already there: a refusal before it (429, 503, a bad file
    the thinker refuses) is the HTTP status, as for any other request."""
    deltas = transcription.deltas()  # aclose() ends its session
    try:
        done = await unless_gone(anext(deltas, None), http_request)
        first = done.result() if done is not None else None
    except BaseException:
        await deltas.aclose()
        raise
    if done is None:  # the client left first: the transcription is ended, nobody reads it
        await deltas.aclose()
        return Response(status_code=204)
    events = sse_events(first, deltas, transcription)
    return TranscriptStream(
        deltas, events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def router(core: GatewayCore) -> APIRouter:
    """The endpoint over `core`; it needs a thinker that takes audio (no talker, no code2wav)."""
    api = APIRouter()

    @api.post(
        ROUTE,
        summary="Speech to text (OpenAI's transcriptions API): the thinker transcribes `file`",
        response_class=Response,
        openapi_extra=OPENAPI_BODY,
        responses=RESPONSES,
    )
    async def transcriptions(http_request: Request) -> Response:
        try:
            fields, transcription = await prepared(core, http_request)
            if fields.stream:
                return await streamed(transcription, http_request)
            done = await unless_gone(transcription.run(), http_request)
            if done is None:  # the client left: the transcription is ended, nobody reads it
                return Response(status_code=204)
            transcript = done.result()
        except OmniError as exc:
            return error_response(as_answered(exc))
        body = rendered(fields.response_format, transcript, transcription.seconds, fields.language)
        if fields.response_format in JSON_FORMATS:
            return JSONResponse(body)
        return PlainTextResponse(body, media_type=TEXT_MEDIA_TYPE)

    return api
