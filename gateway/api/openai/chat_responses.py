"""The two shapes of a chat-completions answer: an SSE stream of `chat.completion.chunk`s, or one
`chat.completion` with the whole text and a WAV (OpenAI's formats, audio as base64).

With audio, as OpenAI answers (openai-python's `ChoiceDeltaAudio` / `ChatCompletionAudio`): the
spoken text is the audio's transcript, not `content`. Streamed: a first chunk with the role and
`content: null`, then `delta.audio.transcript` deltas and `delta.audio.data` deltas (base64) as each
arrives, `delta.audio.id` on the first audio delta only, and a last audio delta holding only
`expires_at`; whole: `message.audio` {id, data, expires_at, transcript} with `content: null`.
`transcript_in_content` (a request extension) also puts the text in `content`, for clients that read
only that. Without audio, text is `content` as always.

Tool calls (when the request's `ToolUse` parses them, gateway/tools/parser.py): the words outside
the calls are the text above; each call is `message.tool_calls[i]` {id, type, function {name,
arguments}}, streamed as `delta.tool_calls` with its index, id, type and name first (arguments "")
and then its arguments in pieces; `finish_reason` "tool_calls" when the answer ended by itself with
calls. An answer that is only calls has `content: null` and, with audio, no `audio` (nothing was
spoken); so has one whose grammar allows calls alone (`required`, a named function) when
`max_tokens` cuts it: `finish_reason` "length", a call cut in its arguments listed with the
arguments that were made (not valid JSON), one cut before its name not listed (OpenAI's report of
a cut).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi.responses import JSONResponse

from gateway.api.openai import sse
from gateway.api.openai.audio_encode import wav_stream_header
from gateway.api.openai.errors import error_body, error_response
from gateway.tools.parser import CallPiece, Piece, TextPiece, ToolCall, ToolCallParser
from gateway.tools.spec import ToolUse
from omnistream.audio.wav import pcm16_wav_bytes, to_pcm16
from omnistream.request.errors import InvalidRequest, OmniError, status_of
from omnistream.request.generation import AudioEvent, DoneEvent, TextEvent

if TYPE_CHECKING:
    from gateway.serving.session import Session


# How long an audio answer's id stays "valid" (OpenAI's expires_at): nothing is kept server side
# here, so this is only the field OpenAI's clients expect.
AUDIO_EXPIRY_SECONDS = 3600


def _chunk(
    cid: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
) -> str:
    body: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return sse.event(body, ascii_only=False)


def _usage(done: DoneEvent) -> dict[str, Any]:
    return {
        "prompt_tokens": len(done.prompt_ids),
        "completion_tokens": len(done.output_ids),
        "total_tokens": len(done.prompt_ids) + len(done.output_ids),
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    }


class _Reader:
    """The answer's text as pieces: words and, when the request's tool use parses them, calls."""

    def __init__(self, tools: ToolUse | None) -> None:
        use = tools or ToolUse()
        self.parser = ToolCallParser(use.names, use.enforced_calls) if use.parse_calls else None
        self.calls_only = use.enforced_calls  # the grammar allows no words

    def feed(self, delta: str) -> list[Piece]:
        if self.parser is None:
            return [TextPiece(delta)] if delta else []
        return self.parser.feed(delta)

    def finish(self) -> list[Piece]:
        return [] if self.parser is None else self.parser.finish()

    @property
    def calls(self) -> list[ToolCall]:
        return [] if self.parser is None else self.parser.calls

    def finish_reason(self, done: DoneEvent) -> str:
        return "tool_calls" if self.calls and done.finish_reason == "stop" else done.finish_reason

    @property
    def of_calls(self) -> bool:
        """An answer of calls (maybe with words), or one that could be nothing else."""
        return bool(self.calls) or self.calls_only


def _call_delta(piece: CallPiece) -> dict[str, Any]:
    entry: dict[str, Any] = {"index": piece.index}
    if piece.id is not None:
        entry |= {"id": piece.id, "type": "function", "function": {"name": piece.name, "arguments": ""}}
    else:
        entry["function"] = {"arguments": piece.arguments}
    return {"tool_calls": [entry]}


def _call_object(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


class _AudioDeltas:
    """The `delta.audio` objects of one streamed answer: the id on the first only."""

    def __init__(self, audio_id: str) -> None:
        self._id: str | None = audio_id

    def __call__(self, **fields: Any) -> dict[str, Any]:
        audio: dict[str, Any] = {}
        if self._id is not None:
            audio["id"], self._id = self._id, None
        return audio | fields


async def sse_stream(
    session: Session,
    cid: str,
    created: int,
    model: str,
    audio_format: str | None,
    include_usage: bool,
    transcript_in_content: bool = False,
    tools: ToolUse | None = None,
) -> AsyncIterator[str]:
    """`audio_format` None: a text-only answer (content deltas)."""
    audio = _AudioDeltas(f"audio-{session.request_id}")
    reader = _Reader(tools)
    header_sent = audio_format != "wav"
    said = False  # a transcript delta went out
    sounded = False  # an audio data delta went out

    def deltas(pieces: list[Piece]) -> list[dict[str, Any]]:
        nonlocal said
        out: list[dict[str, Any]] = []
        for piece in pieces:
            if isinstance(piece, CallPiece):
                out.append(_call_delta(piece))
            elif audio_format is None:
                out.append({"content": piece.text})
            else:
                delta: dict[str, Any] = {}
                if transcript_in_content or not said:  # OpenAI: content null, said once
                    delta["content"] = piece.text if transcript_in_content else None
                said = True
                delta["audio"] = audio(transcript=piece.text)
                out.append(delta)
        return out

    try:
        if audio_format is None:
            yield _chunk(cid, created, model, {"role": "assistant", "content": ""})
        else:
            yield _chunk(cid, created, model, {"role": "assistant", "content": None, "refusal": None})
        async for event in session.events():
            if isinstance(event, TextEvent):
                if not event.delta:
                    continue
                for delta in deltas(reader.feed(event.delta)):
                    yield _chunk(cid, created, model, delta)
            elif isinstance(event, AudioEvent):
                data = to_pcm16(event.audio)
                if not header_sent:
                    data = wav_stream_header(event.sample_rate) + data
                    header_sent = True
                b64 = base64.b64encode(data).decode()
                sounded = True
                yield _chunk(cid, created, model, {"audio": audio(data=b64)})
            elif isinstance(event, DoneEvent):
                for delta in deltas(reader.finish()):
                    yield _chunk(cid, created, model, delta)
                if audio_format is not None and (said or sounded or not reader.of_calls):
                    expires = created + AUDIO_EXPIRY_SECONDS
                    yield _chunk(cid, created, model, {"audio": audio(expires_at=expires)})
                usage = _usage(event) if include_usage else None
                yield _chunk(cid, created, model, {}, finish=reader.finish_reason(event), usage=usage)
        yield sse.DONE
    except OmniError as exc:
        status = status_of(exc).http_status
        yield sse.event(error_body(status, exc.message, exc.kind, exc.field))
        yield sse.DONE
    finally:
        await session.aclose()


async def complete(
    session: Session,
    cid: str,
    created: int,
    model: str,
    audio_format: str,
    want_audio: bool,
    sample_rate: int,
    transcript_in_content: bool = False,
    tools: ToolUse | None = None,
) -> JSONResponse:
    """`sample_rate`: the deployment's, for a WAV without samples; audio events carry their own."""
    reader = _Reader(tools)
    text: list[str] = []
    audio: list[np.ndarray] = []
    done: DoneEvent | None = None

    def words(pieces: list[Piece]) -> None:
        text.extend(p.text for p in pieces if isinstance(p, TextPiece))

    try:
        async for event in session.events():
            if isinstance(event, TextEvent):
                words(reader.feed(event.delta))
            elif isinstance(event, AudioEvent):
                audio.append(event.audio)
                sample_rate = event.sample_rate
            elif isinstance(event, DoneEvent):
                words(reader.finish())
                done = event
    except OmniError as exc:
        return error_response(exc)
    finally:
        await session.aclose()
    if done is None:
        return error_response(InvalidRequest("the request ended without a result"))
    content = "".join(text)
    calls = reader.calls
    message: dict[str, Any] = {"role": "assistant", "content": content or (None if reader.of_calls else "")}
    if calls:
        message["tool_calls"] = [_call_object(c) for c in calls]
    if want_audio and reader.of_calls and not content and not audio:
        message["content"] = None
        message["audio"] = None  # only calls: nothing was spoken
    elif want_audio:
        message["content"] = content if transcript_in_content else None
        message["refusal"] = None
        wav = np.concatenate(audio) if audio else np.zeros(0, np.float32)
        data = pcm16_wav_bytes(wav, sample_rate) if audio_format == "wav" else to_pcm16(wav)
        message["audio"] = {
            "id": f"audio-{session.request_id}",
            "data": base64.b64encode(data).decode(),
            "transcript": content,
            "expires_at": created + AUDIO_EXPIRY_SECONDS,
        }
    return JSONResponse(
        {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": reader.finish_reason(done)}],
            "usage": _usage(done),
        }
    )
