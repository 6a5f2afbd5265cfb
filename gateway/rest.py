"""OpenAI-compatible REST/SSE face of the gateway (`POST /v1/chat/completions` with audio)."""

from __future__ import annotations

import base64
import json
import struct
import time
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.admission import Rejected
from gateway.core import GatewayCore
from gateway.request_guards import BodyLimit, BodyTooLarge, first_invalid_unicode, printable
from omnistream.errors import InternalError, InvalidRequest, OmniError, Unauthenticated, status_of
from omnistream.pipeline import AudioEvent, DoneEvent, GenerationRequest, TextEvent
from omnistream.sampling import SamplingParams
from omnistream.security import bearer_matches
from omnistream.wav import pcm16_wav_bytes, to_pcm16

# The reference model's talker defaults (`generate`): sampled, as the real voice expects.
TALKER_DEFAULTS = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05}

# Unknown fields are refused, and no type is coerced ("stream": "yes", "max_tokens": "12", 0 for
# false): as OpenAI's API does, and as the published JSON schema says (an integer is still a number).
STRICT = ConfigDict(extra="forbid", strict=True)

# Names and labels, not prompt text: `model` is echoed into every streamed chunk, so an unbounded one
# would multiply a request's size by the number of chunks.
Name = Annotated[str, Field(max_length=256)]


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


def _content_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "<string>"
    return "<parts>" if isinstance(value, list) else None


# A tagged union, so a bad `content` is reported against the one form it was meant as (not once as
# "not a string" and once as "not a list"); the tags are dropped from `param` (`_UNION_TAGS`).
Content = Annotated[
    Annotated[str, Tag("<string>")] | Annotated[list[TextPart], Tag("<parts>")],
    Discriminator(
        _content_kind,
        custom_error_type="content_type",
        custom_error_message="Input should be a string or a list of text parts",
    ),
]
_UNION_TAGS = frozenset({"<string>", "<parts>"})


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "user", "assistant", "developer"]
    content: Content
    name: Name | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class AudioOptions(BaseModel):
    model_config = STRICT
    voice: Name = Field("ethan", description="One of the model's speakers (e.g. ethan, chelsie, aiden).")
    format: Literal["wav", "pcm16"] = Field(
        "wav",
        description="wav: a WAV file (streamed: header in the first chunk); "
        "pcm16: raw 16-bit LE 24 kHz mono.",
    )


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = True


class ChatCompletionRequest(BaseModel):
    """The OpenAI chat-completions request, plus omnistream's own knobs (marked as extensions)."""

    model_config = STRICT
    model: Name | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    modalities: list[Literal["text", "audio"]] = Field(["text", "audio"], min_length=1)
    audio: AudioOptions | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    n: int | None = Field(None, ge=1, le=1)
    user: Name | None = None
    # extensions
    speaker: Name | None = Field(None, description="Extension: same as audio.voice.")
    initial_codec_chunk_frames: int | None = Field(
        None,
        ge=1,
        le=25,
        description="Extension: frames in the first audio chunk (default: chosen from load).",
    )
    ignore_eos: bool = Field(False, description="Extension: generate exactly max_tokens (benchmarks).")
    max_audio_frames: int | None = Field(
        None, ge=1, description="Extension: at most this many 80 ms codec frames."
    )
    talker_temperature: float | None = Field(None, ge=0.0, le=2.0, description="Extension: 0 = greedy voice.")
    talker_top_k: int | None = Field(None, ge=0)
    talker_top_p: float | None = Field(None, gt=0.0, le=1.0)
    talker_repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    talker_seed: int | None = Field(None, ge=0, lt=2**63)
    async_chunk: bool | None = Field(
        None, description="Extension: stream stage to stage (default: gateway's)."
    )
    timeout: float | None = Field(
        None, gt=0.0, description="Extension: seconds before the request ends with 504."
    )

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode_everywhere(cls, data: Any) -> Any:
        """Refuse a lone surrogate anywhere in the body (values and keys) with a 422 naming its path.

        JSON may escape one ("\\ud800") and Python decodes it, but it cannot be encoded as UTF-8, so
        it would fail later: building the stage's protobuf message, or writing the SSE stream. One
        walk over the raw body covers every field, present and future.
        """
        path = first_invalid_unicode(data)
        if path is None:
            return data
        error = PydanticCustomError("invalid_unicode", "string is not valid Unicode (a lone surrogate)")
        loc = tuple(printable(p) if isinstance(p, str) else p for p in path)  # the bad one may be a key
        raise ValidationError.from_exception_data(
            cls.__name__, [InitErrorDetails(type=error, loc=loc, input="(not valid Unicode)")]
        )


def to_generation_request(body: ChatCompletionRequest, core: GatewayCore) -> tuple[GenerationRequest, str]:
    config = core.config
    want_audio = "audio" in body.modalities
    voice = body.speaker or (body.audio.voice if body.audio else "ethan")
    audio_format = body.audio.format if body.audio else "wav"
    messages = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages
    ]
    talker = SamplingParams(
        temperature=TALKER_DEFAULTS["temperature"]
        if body.talker_temperature is None
        else body.talker_temperature,
        top_p=body.talker_top_p if body.talker_top_p is not None else TALKER_DEFAULTS["top_p"],
        top_k=body.talker_top_k if body.talker_top_k is not None else TALKER_DEFAULTS["top_k"],
        repetition_penalty=(
            body.talker_repetition_penalty
            if body.talker_repetition_penalty is not None
            else TALKER_DEFAULTS["repetition_penalty"]
        ),
        seed=body.talker_seed if body.talker_seed is not None else body.seed,
    )
    async_chunk = config.async_chunk if body.async_chunk is None else body.async_chunk
    request = GenerationRequest(
        messages=messages,
        max_tokens=body.max_completion_tokens or body.max_tokens or config.default_max_tokens,
        ignore_eos=body.ignore_eos,
        sampling=SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            seed=body.seed,
        ),
        return_audio=want_audio,
        speaker=voice,
        max_audio_frames=body.max_audio_frames or config.max_audio_frames,
        talker_sampling=talker,
        initial_codec_chunk_frames=body.initial_codec_chunk_frames,
        codec_chunk_frames=config.codec_chunk_frames,
        codec_left_context_frames=config.codec_left_context_frames,
        mode="async" if async_chunk else "sequential",
    )
    return request, audio_format


# --- errors ------------------------------------------------------------------------------------------
_TYPES = {
    401: "authentication_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout",
}
# Codes for the statuses Starlette/FastAPI raise themselves (unknown path, wrong method, ...).
_HTTP_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, rate_limit_error, ...")
    param: str | None = Field(None, description="The field at fault, as a path (messages.0.content)")
    code: str = Field(description="The error kind (invalid_request, request_too_large, ...)")


class ErrorResponse(BaseModel):
    """Every non-2xx answer of the API has this body (OpenAI's error format)."""

    error: ErrorDetail


def error_type(status: int) -> str:
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_body(status: int, message: str, kind: str, param: str | None) -> dict[str, Any]:
    # Messages and field names may quote the client's input: escape what UTF-8 cannot carry.
    return {
        "error": {
            "message": printable(message),
            "type": error_type(status),
            "param": printable(param) if param is not None else None,
            "code": kind,
        }
    }


def error_response(exc: OmniError) -> JSONResponse:
    status = status_of(exc).http_status
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, Rejected) else None
    return JSONResponse(
        error_body(status, exc.message, exc.kind, exc.field), status_code=status, headers=headers
    )


_FIELD_NAMES = {"voice": "audio.voice", "speaker": "audio.voice"}


def from_validation_errors(errors: Sequence[Any]) -> InvalidRequest:
    """The first FastAPI/pydantic validation error as the domain error, its location as `param`."""
    if not errors:
        return InvalidRequest("invalid request")
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    if loc[:1] == ("body",):
        loc = loc[1:]
    if first.get("type") == "json_invalid":  # its loc is a character offset, not a field
        detail = (first.get("ctx") or {}).get("error", "decode error")
        offset = f" at character {loc[0]}" if loc else ""
        return InvalidRequest(f"the request body is not valid JSON: {detail}{offset}")
    param = ".".join(str(p) for p in loc if p not in _UNION_TAGS) or None
    if param is None:
        return InvalidRequest(
            "the request body must be a JSON object (Content-Type: application/json): "
            f"{first.get('msg', 'invalid request')}"
        )
    return InvalidRequest(f"{param}: {first.get('msg', 'invalid value')}", field=param)


def from_http_exception(exc: StarletteHTTPException) -> tuple[int, dict[str, Any]]:
    """Status and OpenAI-style body for an HTTPException raised by Starlette or FastAPI."""
    # FastAPI answers a body its JSON parser fails on with a bare 400 (save for syntax errors): bytes
    # that are not UTF-8, nesting past the parser's recursion limit, an integer of over 4,300 digits.
    # Those are plain bad input and get the API's usual 422.
    cause = exc.__cause__
    if exc.status_code == 400 and isinstance(cause, ValueError | RecursionError):
        if isinstance(cause, UnicodeDecodeError):
            message = "the request body is not valid UTF-8"
        elif isinstance(cause, RecursionError):
            message = "the request body is nested too deeply"
        else:
            message = f"the request body is not valid JSON: {cause}"
        return 422, error_body(422, message, InvalidRequest.kind, None)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    return exc.status_code, error_body(exc.status_code, str(exc.detail), code, None)


def _wav_stream_header(sample_rate: int) -> bytes:
    """A WAV header for a stream of unknown length (sizes at their maximum, as streaming servers do)."""
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 0xFFFFFFFF)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", 0xFFFFFFFF)
    )


def build_app(core: GatewayCore) -> FastAPI:
    app = FastAPI(
        title="omnistream gateway",
        version="0.1.0",
        description="OpenAI-compatible chat completions with streamed text and audio (Qwen3-Omni).",
    )

    api_key = core.config.api_key
    if api_key:

        @app.middleware("http")
        async def require_api_key(request: Request, call_next):
            # Only the API needs the key: probes (/health, /ready) and /metrics stay open.
            if request.url.path.startswith("/v1/") and not bearer_matches(
                request.headers.get("authorization"), api_key
            ):
                error = Unauthenticated("missing or invalid API key (Authorization: Bearer <key>)")
                return JSONResponse(
                    error_body(401, error.message, error.kind, None),
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(from_validation_errors(exc.errors()))

    @app.exception_handler(BodyTooLarge)
    async def on_body_too_large(_: Request, exc: BodyTooLarge) -> JSONResponse:
        return error_response(exc.error)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        status, body = from_http_exception(exc)
        return JSONResponse(body, status_code=status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: still a JSON body, without internals (Starlette logs the traceback).
        error = InternalError(f"internal error ({type(exc).__name__})")
        return JSONResponse(error_body(500, error.message, error.kind, None), status_code=500)

    @app.exception_handler(OmniError)
    async def on_omni_error(_: Request, exc: OmniError) -> JSONResponse:
        if exc.field in _FIELD_NAMES:
            exc.field = _FIELD_NAMES[exc.field]
        return error_response(exc)

    @app.get("/health", summary="The process is alive")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/ready", summary="Every stage has a SERVING replica", responses={503: {"description": "not ready"}}
    )
    async def ready() -> JSONResponse:
        body: dict[str, Any] = {"ready": core.ready, "stages": core.replicas.snapshot()}
        if not core.ready:
            body |= error_body(503, _unavailable().message, "unavailable", None)
        return JSONResponse(body, status_code=200 if core.ready else 503)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def metrics() -> Response:
        return Response(generate_latest(core.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", summary="The served model")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": core.config.model_name, "object": "model", "created": 0, "owned_by": "omnistream"}
            ],
        }

    @app.post(
        "/v1/chat/completions",
        summary="Chat completion with text and audio",
        responses={
            200: {
                "description": "A chat.completion; with stream=true an SSE stream of chat.completion.chunk",
                "content": {"text/event-stream": {}},
            },
            401: {"model": ErrorResponse, "description": "Missing or wrong API key (when one is set)"},
            413: {
                "model": ErrorResponse,
                "description": "Body over max_request_bytes, or prompt over max_prompt_chars",
            },
            422: {"model": ErrorResponse, "description": "Invalid request (`param` names the field)"},
            429: {"model": ErrorResponse, "description": "Overloaded (see Retry-After)"},
            503: {"model": ErrorResponse, "description": "No healthy replica"},
            504: {"model": ErrorResponse, "description": "Timed out (the request's `timeout`)"},
        },
    )
    async def chat_completions(body: ChatCompletionRequest, http_request: Request) -> Response:
        if not core.ready:
            raise _unavailable()
        request, audio_format = to_generation_request(body, core)
        session = await core.open(request, timeout=body.timeout)
        completion_id = f"chatcmpl-{session.request_id}"
        created = int(time.time())
        model = body.model or core.config.model_name
        if body.stream:
            include_usage = body.stream_options.include_usage if body.stream_options else True
            return StreamingResponse(
                _sse(session, completion_id, created, model, audio_format, include_usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Request-Id": session.request_id},
            )
        return await _complete(session, completion_id, created, model, audio_format, request.return_audio)

    # Added last, so it runs first: an oversize body is refused before anything reads it.
    app.add_middleware(BodyLimit, limit=core.config.max_request_bytes, respond=error_response)
    return app


def _unavailable() -> OmniError:
    from omnistream.errors import Unavailable

    return Unavailable("the gateway has no healthy replica for every stage yet")


def _chunk(cid: str, created: int, model: str, delta: dict, finish: str | None = None, usage=None) -> str:
    body: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _usage(done: DoneEvent) -> dict[str, int]:
    return {
        "prompt_tokens": len(done.prompt_ids),
        "completion_tokens": len(done.output_ids),
        "total_tokens": len(done.prompt_ids) + len(done.output_ids),
    }


async def _sse(
    session, cid: str, created: int, model: str, audio_format: str, include_usage: bool
) -> AsyncIterator[str]:
    audio_id = f"audio-{session.request_id}"
    header_sent = audio_format != "wav"
    try:
        yield _chunk(cid, created, model, {"role": "assistant", "content": ""})
        async for event in session.events():
            if isinstance(event, TextEvent):
                if event.delta:
                    yield _chunk(cid, created, model, {"content": event.delta})
            elif isinstance(event, AudioEvent):
                data = to_pcm16(event.audio)
                if not header_sent:
                    data = _wav_stream_header(event.sample_rate) + data
                    header_sent = True
                b64 = base64.b64encode(data).decode()
                yield _chunk(cid, created, model, {"audio": {"id": audio_id, "data": b64, "transcript": ""}})
            elif isinstance(event, DoneEvent):
                usage = _usage(event) if include_usage else None
                yield _chunk(cid, created, model, {}, finish=event.finish_reason, usage=usage)
        yield "data: [DONE]\n\n"
    except OmniError as exc:
        status = status_of(exc).http_status
        yield f"data: {json.dumps(error_body(status, exc.message, exc.kind, exc.field))}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        await session.aclose()


async def _complete(
    session, cid: str, created: int, model: str, audio_format: str, want_audio: bool
) -> JSONResponse:
    text: list[str] = []
    audio: list[np.ndarray] = []
    done: DoneEvent | None = None
    sample_rate = 24000
    try:
        async for event in session.events():
            if isinstance(event, TextEvent):
                text.append(event.delta)
            elif isinstance(event, AudioEvent):
                audio.append(event.audio)
                sample_rate = event.sample_rate
            elif isinstance(event, DoneEvent):
                done = event
    except OmniError as exc:
        return error_response(exc)
    finally:
        await session.aclose()
    if done is None:
        return error_response(InvalidRequest("the request ended without a result"))
    content = "".join(text)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if want_audio:
        wav = np.concatenate(audio) if audio else np.zeros(0, np.float32)
        data = pcm16_wav_bytes(wav, sample_rate) if audio_format == "wav" else to_pcm16(wav)
        message["audio"] = {
            "id": f"audio-{session.request_id}",
            "data": base64.b64encode(data).decode(),
            "transcript": content,
            "expires_at": created + 3600,
        }
    return JSONResponse(
        {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": done.finish_reason}],
            "usage": _usage(done),
        }
    )
