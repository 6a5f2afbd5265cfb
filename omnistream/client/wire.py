"""The gateway's wire messages and statuses as the client's events and errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import grpc
import numpy as np

from omnistream.client.events import AudioChunk, End, Event, TextDelta, Usage
from omnistream.proto.omni.v1 import gateway_pb2
from omnistream.request.errors import OmniError, from_grpc
from omnistream.service.server import ERROR_KIND_METADATA_KEY
from omnistream.wire.tensors import numpy_from_proto

RETRY_AFTER_METADATA_KEY = "retry-after"


def to_event(message: gateway_pb2.GenerateEvent) -> Event | None:
    """The client event for one wire event; None for `error`, whose status follows at once."""
    kind = message.WhichOneof("event")
    if kind == "text":
        return TextDelta(message.text.text, tuple(message.text.token_ids))
    if kind == "audio":
        pcm = numpy_from_proto(message.audio.pcm, field="pcm")
        samples = np.asarray(pcm, dtype=np.float32).reshape(-1)
        return AudioChunk(samples, message.audio.sample_rate, int(message.audio.first_sample))
    if kind == "usage":
        u = message.usage
        return Usage(
            prompt_tokens=u.prompt_tokens,
            completion_tokens=u.completion_tokens,
            audio_frames=u.audio_frames,
            audio_samples=u.audio_samples,
            ttft=u.ttft_seconds if u.HasField("ttft_seconds") else None,
            ttfp=u.ttfp_seconds if u.HasField("ttfp_seconds") else None,
            e2e=u.e2e_seconds,
        )
    if kind == "end":
        return End(message.end.finish_reason)
    return None


def to_error(
    code: grpc.StatusCode, details: str | None, metadata: Iterable[tuple[str, str | bytes]] | None
) -> OmniError:
    """The project's typed error for a status (one table: omnistream/request/errors.py), carrying the gRPC
    `code`, the server's error `kind` and, for overload, `retry_after` seconds."""
    pairs = list(metadata or ())
    kinds = [str(value) for key, value in pairs if key == ERROR_KIND_METADATA_KEY]
    error = from_grpc(code, details or code.name, kind=kinds[-1] if kinds else None)  # the kind's class
    error.code = code  # type: ignore[attr-defined]
    error.retry_after = None  # type: ignore[attr-defined]
    for key, value in pairs:
        if key == RETRY_AFTER_METADATA_KEY:
            with contextlib.suppress(ValueError):
                error.retry_after = float(value)  # type: ignore[attr-defined]
    return error


def retryable(error: OmniError) -> bool:
    """Safe to send again when nothing was received yet: no replica, or the gateway was full."""
    return error.kind in ("unavailable", "overloaded")
