"""The gateway's spans: one SERVER span per request, one CLIENT span per stage call under it.

An entry point only names its span and hands over the caller's trace context (`http_entry`,
`grpc_entry`, `realtime_entry`: a `traceparent` header or metadata entry); `GatewayCore.open`
starts the `RequestSpan` before anything can refuse the request, so a refusal (429, 4xx, 503) ends
it with its status, and once the request runs its `Session` ends it whichever way it ends (done,
cancelled, failed, past its deadline). The attributes are read where the gateway's Prometheus
metrics read them (the session's `Timings`, its listener, the admission `Permit`): one measurement,
two outlets. Names follow vLLM's request span (`gen_ai.*`), the audio ones are `omnistream.audio.*`.

`StageCalls` opens the CLIENT span of each stage stream the request opens (gateway/serving/
stage_calls.py) and hands its `traceparent` to the call's metadata, where the stage continues it
(omnistream/service/stage_tracing.py).

With tracing off (no tracer provider installed, omnistream/service/tracing.py) every span is the
API's no-op span: nothing is recorded, no stage call carries metadata, and each method returns
after one attribute check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from omnistream.audio.listener import Listening
from omnistream.request.errors import OmniError, status_of
from omnistream.request.generation import DoneEvent, GenerationRequest
from omnistream.service.tracing import GrpcMetadata, extract_headers, extract_metadata, inject_metadata

if TYPE_CHECKING:
    from gateway.admission.permits import Permit

tracer = trace.get_tracer("omnistream.gateway")

STAGE_SERVICES = {
    "thinker": "omni.v1.ThinkerService",
    "talker": "omni.v1.TalkerService",
    "code2wav": "omni.v1.Code2WavService",
}
GRPC_OK, GRPC_CANCELLED = 0, 1


@dataclass(frozen=True)
class Incoming:
    """What an entry point hands `GatewayCore.open`: its span's name, the caller's trace context
    (None: the current one, which the realtime route set from the WebSocket upgrade), the face
    (http, grpc, websocket: which status attribute a refusal gets) and attributes of its own."""

    name: str
    parent: Context | None = None
    face: str = "http"
    attributes: Mapping[str, Any] = field(default_factory=dict)


def http_entry(method: str, route: str, headers: Mapping[str, str]) -> Incoming:
    """A REST request's span (`POST /v1/chat/completions`), continuing its `traceparent` header."""
    attributes = {"http.request.method": method, "http.route": route}
    return Incoming(f"{method} {route}", extract_headers(headers), "http", attributes)


def grpc_entry(service: str, method: str, metadata: Any) -> Incoming:
    """A gRPC API call's span (`omni.v1.Gateway/Generate`), continuing its metadata's `traceparent`."""
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
    return Incoming(f"{service}/{method}", extract_metadata(metadata), "grpc", attributes)


def realtime_entry(response_id: str) -> Incoming:
    """A realtime response's span: its parent is the context `remote_parent` set for the socket."""
    return Incoming("realtime response", None, "websocket", {"omnistream.realtime.response_id": response_id})


def transcription_entry(item_id: str) -> Incoming:
    """A realtime input transcription's span (the user item it transcribes), under the socket's."""
    return Incoming("realtime transcription", None, "websocket", {"omnistream.realtime.item_id": item_id})


class remote_parent:
    """`with remote_parent(headers):` makes the caller's trace context (a WebSocket upgrade's
    `traceparent`) the current one, so every task started inside (the socket's responses) inherits
    it as its parent. A no-op without such a header."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._context = extract_headers(headers) if "traceparent" in headers else None
        self._token: object | None = None

    def __enter__(self) -> None:
        if self._context is not None:
            self._token = otel_context.attach(self._context)

    def __exit__(self, *_exc: object) -> None:
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]


def _error_attributes(span: trace.Span, error: BaseException) -> None:
    kind = error.kind if isinstance(error, OmniError) else type(error).__name__
    message = error.message if isinstance(error, OmniError) else str(error) or kind
    span.set_attribute("error.type", kind)
    span.set_attribute("omnistream.error.kind", kind)
    span.set_status(Status(StatusCode.ERROR, message))


class _Timings(Protocol):
    """The session's `Timings` (perf_counter seconds), as far as the span reads them."""

    started: float
    first_text: float | None
    first_audio: float | None
    ended: float | None
    audio_seconds: float
    audio_chunks: list[Any]


class Ended(Protocol):
    """What a span reads of a request that ran: its `Session` (gateway/serving/session.py, which
    imports this module: a protocol, not an import back)."""

    timings: _Timings
    done: DoneEvent | None
    error: BaseException | None

    @property
    def status(self) -> str: ...

    def listening(self) -> Listening: ...


class RequestSpan:
    """The SERVER span of one request (see the module docstring for who starts and ends it)."""

    def __init__(self, incoming: Incoming | None, request_id: str, request: GenerationRequest) -> None:
        incoming = incoming or Incoming("request")
        self.face = incoming.face
        self.span = tracer.start_span(incoming.name, context=incoming.parent, kind=SpanKind.SERVER)
        self.recording = self.span.is_recording()
        self.active = self.span.get_span_context().is_valid  # propagated even when not sampled
        self._ended = False
        if self.recording:
            s = request.sampling
            self.span.set_attributes(
                {
                    **incoming.attributes,
                    "gen_ai.request.id": request_id,
                    "gen_ai.request.max_tokens": request.max_tokens,
                    "gen_ai.request.temperature": s.temperature,
                    "gen_ai.request.top_p": s.top_p,
                    "omnistream.audio.requested": request.return_audio,
                }
            )
            if s.seed is not None:
                self.span.set_attribute("gen_ai.request.seed", s.seed)
            if request.return_audio:
                self.span.set_attribute("omnistream.audio.max_frames", request.max_audio_frames)
                self.span.set_attribute("omnistream.audio.voice", request.speaker)

    @property
    def context(self) -> Context:
        """The context whose span is this one: the parent of the stage calls."""
        return trace.set_span_in_context(self.span, Context())

    def admitted(self, permit: Permit, model: str | None, first_chunk_frames: int | None) -> None:
        """Admission's waits (Permit: the audio hold's share, and all of it) and the request's plan."""
        if not self.recording:
            return
        self.span.set_attribute("gen_ai.latency.time_in_queue", permit.waited_s)
        if model:
            self.span.set_attribute("gen_ai.response.model", model)
        if permit.audio:
            self.span.set_attribute("omnistream.audio.held", permit.held_s)
        if first_chunk_frames is not None:
            self.span.set_attribute("omnistream.audio.first_chunk_frames", first_chunk_frames)

    def retried(self, error: OmniError, attempt: int) -> None:
        """A replica refused before any output: the request moves to another (GatewayCore.open)."""
        if self.recording:
            self.span.add_event("retry", {"attempt": attempt, "omnistream.error.kind": error.kind})

    def resumed(self, stage: str, lost: str, sibling: str, error: OmniError) -> None:
        """A replica lost under the running request: its `stage` goes on at `sibling`
        (gateway/serving/resume.py); the span names both."""
        if self.recording:
            self.span.add_event(
                "resume",
                {
                    "omnistream.stage": stage,
                    "omnistream.resume.from": lost,
                    "omnistream.resume.to": sibling,
                    "omnistream.error.kind": error.kind,
                },
            )

    def note(self, attributes: Mapping[str, Any]) -> None:
        """Attributes measured outside the session while the request runs (a realtime response's
        voice-to-voice, gateway/realtime/voice_to_voice.py); nothing once the span has ended."""
        if self.recording and not self._ended:
            self.span.set_attributes(attributes)

    def stage_calls(self, peers: Mapping[str, str], request_id: str) -> StageCalls | None:
        """The CLIENT spans of one attempt's stage calls; None with tracing off."""
        return StageCalls(self.context, peers, request_id) if self.active else None

    def refused(self, error: BaseException) -> None:
        """Ends the span of a request that never ran: refused (a 4xx, 429, 503) or left while waiting."""
        if self._ended:
            return
        self._ended = True
        if self.recording:
            if isinstance(error, asyncio.CancelledError):
                self.span.set_attribute("omnistream.outcome", "cancelled")
                self.span.add_event("cancelled", {"reason": "the client left before the request ran"})
            else:
                self.span.set_attribute("omnistream.outcome", "refused")
                status = status_of(error)
                if self.face == "http":
                    self.span.set_attribute("http.response.status_code", status.http_status)
                elif self.face == "grpc":
                    self.span.set_attribute("rpc.grpc.status_code", status.grpc_code.value[0])
                _error_attributes(self.span, error)
        self.span.end()

    def finish(self, session: Ended) -> None:
        """Ends the span of a request that ran, with what its session measured (its `Timings`, its
        listener, its end). Never blocks: the span only joins the exporter's queue."""
        if self._ended:
            return
        self._ended = True
        if self.recording:
            self._record(session)
        self.span.end()

    def _record(self, session: Ended) -> None:
        t, done, span, status = session.timings, session.done, self.span, session.status
        error = session.error
        if status == "cancelled" and error is not None and not isinstance(error, asyncio.CancelledError):
            status = "failed"  # an error that is no OmniError (a bug), not the client leaving
        values: dict[str, Any] = {"omnistream.outcome": status}
        if t.first_text is not None:
            values["gen_ai.latency.time_to_first_token"] = t.first_text - t.started
        if t.ended is not None:
            values["gen_ai.latency.e2e"] = t.ended - t.started
        if t.first_audio is not None:
            values["omnistream.audio.time_to_first_audio"] = t.first_audio - t.started
        if t.audio_chunks:
            heard = session.listening()
            values["omnistream.audio.seconds"] = t.audio_seconds
            values["omnistream.audio.chunks"] = heard.chunks
            values["omnistream.audio.stalls"] = heard.stalls
            values["omnistream.audio.stall_seconds"] = heard.stall_s
            values["omnistream.audio.underrun"] = heard.underrun_s
            values["omnistream.audio.continuity_ok"] = heard.continuity_ok
        if done is not None:
            values["gen_ai.usage.prompt_tokens"] = len(done.prompt_ids)
            values["gen_ai.usage.completion_tokens"] = len(done.output_ids)
            values["gen_ai.usage.cached_tokens"] = done.cached_tokens
            values["gen_ai.response.finish_reasons"] = (done.finish_reason,)
            values["omnistream.audio.frames"] = done.frames
        span.set_attributes(values)
        if self.face == "grpc" and status in ("ok", "cancelled"):
            span.set_attribute("rpc.grpc.status_code", GRPC_OK if status == "ok" else GRPC_CANCELLED)
        if status == "cancelled":
            span.add_event("cancelled", {"reason": "the client left before the answer ended"})
        elif status != "ok" and session.error is not None:
            if self.face == "grpc":
                span.set_attribute("rpc.grpc.status_code", status_of(session.error).grpc_code.value[0])
            _error_attributes(span, session.error)


class StageCalls:
    """The CLIENT spans of one attempt's three stage streams, children of the request's span."""

    def __init__(self, parent: Context, peers: Mapping[str, str], request_id: str) -> None:
        self._parent = parent
        self._peers = peers
        self._request_id = request_id
        self.spans: dict[str, trace.Span] = {}

    def metadata(self, stage: str) -> GrpcMetadata:
        """Start `stage`'s CLIENT span; the call's metadata carrying it to the stage."""
        service = STAGE_SERVICES[stage]
        span = tracer.start_span(f"{service}/Stream", context=self._parent, kind=SpanKind.CLIENT)
        self.spans[stage] = span
        if span.is_recording():
            host, _, port = self._peers.get(stage, "").rpartition(":")
            span.set_attributes(
                {
                    "rpc.system": "grpc",
                    "rpc.service": service,
                    "rpc.method": "Stream",
                    "omnistream.stage": stage,
                    "gen_ai.request.id": self._request_id,
                    **({"server.address": host} if host else {}),
                    **({"server.port": int(port)} if port.isdigit() else {}),
                }
            )
        return inject_metadata(trace.set_span_in_context(span, Context()))

    def moved(self, stage: str, address: str, error: OmniError) -> GrpcMetadata:
        """`stage`'s call was lost (its span ends failed with `error`) and goes on at `address`: the
        new call's metadata, with its own CLIENT span."""
        lost = self.spans.get(stage)
        if lost is not None:
            if lost.is_recording():
                code = status_of(error).grpc_code.value[0]
                lost.set_attributes({"omnistream.outcome": "failed", "rpc.grpc.status_code": code})
                _error_attributes(lost, error)
            lost.end()
        self._peers = {**self._peers, stage: address}
        return self.metadata(stage)

    def end(self, error: BaseException | None, results: Mapping[str, Mapping[str, Any]]) -> None:
        """End every call's span: ok, cancelled (the client left, or another stage failed first:
        this call was cancelled with the request) or failed (the stage the error names, or all of
        them for an error that names none). `results`: each stage's own attributes."""
        failed = error.stage if isinstance(error, OmniError) else None
        for stage, span in self.spans.items():
            if span.is_recording():
                span.set_attributes(results.get(stage, {}))
                if error is None:
                    span.set_attributes({"omnistream.outcome": "ok", "rpc.grpc.status_code": GRPC_OK})
                elif isinstance(error, asyncio.CancelledError) or (failed is not None and failed != stage):
                    span.set_attributes(
                        {"omnistream.outcome": "cancelled", "rpc.grpc.status_code": GRPC_CANCELLED}
                    )
                    span.add_event("cancelled", {"reason": "the request ended before this call did"})
                else:
                    code = status_of(error).grpc_code.value[0]
                    span.set_attributes({"omnistream.outcome": "failed", "rpc.grpc.status_code": code})
                    _error_attributes(span, error)
            span.end()
