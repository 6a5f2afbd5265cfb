"""A stage's SERVER span per stream, continuing the gateway's CLIENT span from the call's metadata.

`StageServicer.Stream` (stage_service.py) opens one `StreamSpan` as the call arrives and ends it in
its `finally`, so every way a stream ends is recorded: ok, cancelled (the gateway cancelled the call:
its client left, another stage failed, or its deadline passed: `deadline`), failed (the status the
stage sent: its gRPC code, message and error kind; a bug as `internal`).

The stage's own timings, measured here at the servicer, where the stream's life is seen whole:
`omnistream.stage.time_in_open` (reading the open message, validation, tokenizing or media
preprocessing, the engine's admission), `omnistream.stage.time_to_first_chunk` (from admission to
the first output message: the engine's queue and prefill, for the audio stages the wait for their
first input too), the engine's running and waiting requests as this one joined (itself
included), the chunks in and out, and the units made (thinker: tokens, one per decode step; talker:
codec frames, one per step; code2wav: samples). With tracing off the span is the API's no-op span
and every method returns after one check.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from omnistream.request.errors import OmniError, status_of
from omnistream.service.tracing import extract_metadata

tracer = trace.get_tracer("omnistream.stage")


def _units(chunk: Any) -> tuple[str, int]:
    """(attribute, count) of what one output message carries, by its type (stage.proto)."""
    kind = chunk.DESCRIPTOR.name
    if kind == "ThinkerChunk":
        return "gen_ai.usage.completion_tokens", len(chunk.token_ids)
    if kind == "TalkerChunk":  # codes [codebooks, frames]
        shape = chunk.codes.shape
        return "omnistream.audio.frames", int(shape[1]) if len(shape) == 2 else 0
    shape = chunk.audio.shape  # AudioChunk
    return "omnistream.audio.samples", int(shape[0]) if len(shape) else 0


class StreamSpan:
    """The SERVER span of one stage stream."""

    def __init__(self, stage: str, service: str, context: grpc.aio.ServicerContext) -> None:
        """`service`: the gRPC service's full name (omni.v1.ThinkerService)."""
        parent = extract_metadata(context.invocation_metadata())
        self.span = tracer.start_span(f"{service}/Stream", context=parent, kind=SpanKind.SERVER)
        self.recording = self.span.is_recording()
        self._started = time.perf_counter()
        self._admitted: float | None = None
        self._error: BaseException | None = None
        self._chunks = 0
        self._units: dict[str, int] = {}
        self._finish_reason = ""
        if self.recording:
            self.span.set_attributes(
                {
                    "rpc.system": "grpc",
                    "rpc.service": service,
                    "rpc.method": "Stream",
                    "omnistream.stage": stage,
                }
            )

    def admitted(self, request_id: str, counts: Callable[[], tuple[int, int]]) -> None:
        """The engine took the request; `counts`: the engine's (running, waiting) requests, this one
        included (read only when the span records: it takes the engine's lock)."""
        if not self.recording:
            return
        self._admitted = time.perf_counter()
        running, waiting = counts()
        self.span.set_attributes(
            {
                "gen_ai.request.id": request_id,
                "omnistream.stage.time_in_open": self._admitted - self._started,
                "omnistream.stage.engine_running": running,
                "omnistream.stage.engine_waiting": waiting,
            }
        )

    def chunk(self, chunk: Any) -> None:
        """One output message is about to be written."""
        if not self.recording:
            return
        if self._chunks == 0 and self._admitted is not None:
            first = time.perf_counter() - self._admitted
            self.span.set_attribute("omnistream.stage.time_to_first_chunk", first)
        self._chunks += 1
        name, count = _units(chunk)
        self._units[name] = self._units.get(name, 0) + count
        if getattr(chunk, "prompt_ids", None):  # the thinker's first chunk
            self.span.set_attribute("gen_ai.usage.prompt_tokens", len(chunk.prompt_ids))
            self.span.set_attribute("gen_ai.usage.cached_tokens", chunk.cached_tokens)
        self._finish_reason = getattr(chunk, "finish_reason", "") or self._finish_reason

    def failed(self, error: BaseException) -> None:
        """The stream ends with an error: the status the stage sends (OmniError) or a bug."""
        if self._error is None:
            self._error = error

    def end(self, context: grpc.aio.ServicerContext, chunks_in: int) -> None:
        """Record how the stream ended and end the span (it joins the exporter's queue: no wait)."""
        if self.recording:
            self._record(context, chunks_in)
        self.span.end()

    def _record(self, context: grpc.aio.ServicerContext, chunks_in: int) -> None:
        span, error = self.span, self._error
        span.set_attributes(
            {
                "omnistream.stage.chunks_out": self._chunks,
                "omnistream.stage.chunks_in": chunks_in,
                **self._units,
            }
        )
        if self._finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", (self._finish_reason,))
        if error is None:
            span.set_attributes(
                {"omnistream.outcome": "ok", "rpc.grpc.status_code": grpc.StatusCode.OK.value[0]}
            )
        elif isinstance(error, asyncio.CancelledError):
            left = context.time_remaining()
            outcome = "deadline" if left is not None and left <= 0 else "cancelled"
            code = grpc.StatusCode.DEADLINE_EXCEEDED if outcome == "deadline" else grpc.StatusCode.CANCELLED
            span.set_attributes({"omnistream.outcome": outcome, "rpc.grpc.status_code": code.value[0]})
            span.add_event("cancelled", {"reason": f"the caller ended the call ({code.name})"})
        else:
            kind = error.kind if isinstance(error, OmniError) else "internal"
            message = (
                error.message if isinstance(error, OmniError) else f"internal error ({type(error).__name__})"
            )
            span.set_attributes(
                {
                    "omnistream.outcome": "failed",
                    "rpc.grpc.status_code": status_of(error).grpc_code.value[0],
                    "error.type": kind,
                    "omnistream.error.kind": kind,
                }
            )
            span.set_status(Status(StatusCode.ERROR, message))
