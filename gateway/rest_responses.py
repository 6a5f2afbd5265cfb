"""The two shapes of a chat-completions answer: an SSE stream of `chat.completion.chunk`s, or one
`chat.completion` with the whole text and a WAV (OpenAI's formats, audio as base64)."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi.responses import JSONResponse

from gateway.rest_errors import error_body, error_response
from omnistream.errors import InvalidRequest, OmniError, status_of
from omnistream.request import AudioEvent, DoneEvent, TextEvent
from omnistream.wav import pcm16_wav_bytes, to_pcm16


def wav_stream_header(sample_rate: int) -> bytes:
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


async def sse_stream(
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
                    data = wav_stream_header(event.sample_rate) + data
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


async def complete(
    session, cid: str, created: int, model: str, audio_format: str, want_audio: bool, sample_rate: int
) -> JSONResponse:
    """`sample_rate`: the deployment's, for a WAV without samples; audio events carry their own."""
    text: list[str] = []
    audio: list[np.ndarray] = []
    done: DoneEvent | None = None
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
