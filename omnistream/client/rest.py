"""The same client over REST/SSE (`POST /v1/chat/completions`), for callers that can reach only HTTP.

Events are the gRPC clients' (`TextDelta`, `AudioChunk`, `Usage`, `End`); audio travels as 16-bit
PCM on this path (the OpenAI API's format), so samples are the float32 ones quantised to 16 bits.
Thinker `top_k`/`repetition_penalty` are not REST fields; asking for them here is an error.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import httpx
import numpy as np

from omnistream.client.events import AudioChunk, End, Event, Result, TextDelta, Usage
from omnistream.client.request import MEDIA_KINDS, Messages
from omnistream.request.errors import OmniError, from_kind

SAMPLE_RATE_HEADER = 24000  # REST pcm16 audio carries no rate: the deployment's (GET /v1/models)
MEDIA_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/ogg": "ogg"}


def _part(part: Mapping[str, Any]) -> dict[str, Any]:
    if part["type"] == "text":
        return {"type": "text", "text": part["text"]}
    if part["type"] not in MEDIA_KINDS:
        raise ValueError(f"unknown content part type {part['type']!r}")
    data = base64.b64encode(part["data"]).decode()
    mime = part.get("mime_type") or "application/octet-stream"
    if part["type"] == "audio":
        fmt = MEDIA_FORMATS.get(mime, mime.rsplit("/", 1)[-1])
        return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}
    key = "image_url" if part["type"] == "image" else "video_url"
    return {"type": key, key: {"url": f"data:{mime};base64,{data}"}}


def build_body(messages: Messages | None, **options: Any) -> dict[str, Any]:
    """The chat-completions body for the gRPC clients' keyword arguments (streamed, pcm16 audio)."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if options.pop("prompt_ids", None) is not None:
        raise ValueError("prompt_ids is a gRPC API field; REST takes messages")
    for name in ("top_k", "repetition_penalty"):
        if options.pop(name, None) is not None:
            raise ValueError(f"{name} is not a REST field (use the gRPC client)")
    audio = options.pop("audio", True)
    voice = options.pop("voice", None)
    body: dict[str, Any] = {
        "messages": [
            {
                "role": m["role"],
                "content": m["content"]
                if isinstance(m["content"], str)
                else [_part(p) for p in m["content"]],
            }
            for m in _turns(messages)
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "modalities": ["text", "audio"] if audio else ["text"],
    }
    if audio:
        body["audio"] = {"format": "pcm16", **({"voice": voice} if voice else {})}
    if options.pop("request_id", None):
        raise ValueError("request_id is a gRPC API field")
    # Unset is None; False is a value (`async_chunk=False` asks for sequential mode, whose default
    # is on), so it is sent like any other.
    for key, value in options.items():
        if value is not None:
            body[key] = value
    return body


def _turns(messages: Sequence[Mapping[str, Any]] | None) -> Sequence[Mapping[str, Any]]:
    if not messages:
        raise ValueError("give messages")
    return messages


def _error(status: int, text: str, headers: Mapping[str, str]) -> OmniError:
    try:
        err = json.loads(text)["error"]
        error = from_kind(err.get("code") or "internal", err.get("message") or text, err.get("param"))
    except (ValueError, KeyError, TypeError):
        error = from_kind("internal", f"HTTP {status}: {text[:200]}")
    error.http_status = status  # type: ignore[attr-defined]
    retry = headers.get("retry-after")
    error.retry_after = float(retry) if retry and retry.replace(".", "", 1).isdigit() else None  # type: ignore[attr-defined]
    return error


class _Parser:
    """SSE lines -> events; keeps the sample count so chunks carry their first sample."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self.samples = 0

    def events(self, line: str) -> list[Event]:
        if not line.startswith("data: ") or line == "data: [DONE]":
            return []
        data = json.loads(line[6:])
        if "error" in data:
            err = data["error"]
            raise from_kind(err.get("code") or "internal", err.get("message", ""), err.get("param"))
        out: list[Event] = []
        choice = data["choices"][0] if data.get("choices") else {}
        delta = choice.get("delta") or {}
        audio = delta.get("audio") or {}
        # With audio the text is the audio's transcript (content null, as OpenAI sends it); with
        # the transcript_in_content extension it is in both: taken once.
        text = audio.get("transcript") or delta.get("content")
        if text:
            out.append(TextDelta(text))
        if audio.get("data"):
            pcm = np.frombuffer(base64.b64decode(audio["data"]), dtype="<i2")
            out.append(AudioChunk(pcm.astype(np.float32) / 32767.0, self.sample_rate, self.samples))
            self.samples += pcm.size
        if data.get("usage"):
            u = data["usage"]
            out.append(Usage(u.get("prompt_tokens", 0), u.get("completion_tokens", 0)))
        if choice.get("finish_reason"):
            out.append(End(choice["finish_reason"]))
        return out


class RestClient:
    """Blocking REST/SSE client: `base_url` like "http://127.0.0.1:8000"; `verify` as httpx takes it
    (a CA path or an ssl.SSLContext for TLS and mTLS)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: Any = True,
        sample_rate: int = SAMPLE_RATE_HEADER,
        timeout: float = 600.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url, headers=headers, verify=verify, timeout=timeout)
        self.sample_rate = sample_rate

    def __enter__(self) -> RestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def generate(self, messages: Messages | None = None, **options: Any) -> Iterator[Event]:
        body = build_body(messages, **options)
        parser = _Parser(self.sample_rate)
        with self._http.stream("POST", "/v1/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                raise _error(reply.status_code, reply.read().decode(errors="replace"), reply.headers)
            for line in reply.iter_lines():
                yield from parser.events(line)

    def complete(self, messages: Messages | None = None, **options: Any) -> Result:
        result = Result()
        for event in self.generate(messages, **options):
            result.add(event)
        return result


class AsyncRestClient:
    """The asyncio twin of `RestClient`."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: Any = True,
        sample_rate: int = SAMPLE_RATE_HEADER,
        timeout: float = 600.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, verify=verify, timeout=timeout)
        self.sample_rate = sample_rate

    async def __aenter__(self) -> AsyncRestClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def generate(self, messages: Messages | None = None, **options: Any) -> AsyncIterator[Event]:
        body = build_body(messages, **options)
        parser = _Parser(self.sample_rate)
        async with self._http.stream("POST", "/v1/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                text = (await reply.aread()).decode(errors="replace")
                raise _error(reply.status_code, text, reply.headers)
            async for line in reply.aiter_lines():
                for event in parser.events(line):
                    yield event

    async def complete(self, messages: Messages | None = None, **options: Any) -> Result:
        result = Result()
        async for event in self.generate(messages, **options):
            result.add(event)
        return result
