"""The gateway's spans (gateway/serving/tracing.py) end on every path with what happened: refused
(429 on REST, RESOURCE_EXHAUSTED on gRPC), a client gone while queued, a stage failure (that stage's
call failed, the others cancelled with the request), past the deadline, done. The SDK's in-memory
exporter is fine here (a unit test of the code around the spans); the OTLP path end to end is
tests/integration/test_tracing.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.admission.permits import Rejected
from gateway.serving import tracing
from omnistream.audio.listener import listen
from omnistream.request.errors import DeadlineExceeded, Unavailable
from omnistream.request.generation import DoneEvent, GenerationRequest


def _request() -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=4)


@dataclass
class _Timings:
    started: float = 10.0
    first_text: float | None = None
    first_audio: float | None = None
    ended: float | None = None
    audio_seconds: float = 0.0
    audio_chunks: list[Any] = field(default_factory=list)


@dataclass
class _Session:
    status: str
    error: BaseException | None = None
    done: DoneEvent | None = None
    timings: _Timings = field(default_factory=_Timings)

    def listening(self):
        return listen(self.timings.audio_chunks)


def _only(exporter: InMemorySpanExporter, kind: SpanKind):
    found = [s for s in exporter.get_finished_spans() if s.kind == kind]
    return found


@pytest.mark.parametrize(
    ("face", "status_attribute", "value"),
    [("http", "http.response.status_code", 429), ("grpc", "rpc.grpc.status_code", 8)],
)
def test_a_refused_request_ends_its_span_with_the_status(spans, face, status_attribute, value):
    span = tracing.RequestSpan(tracing.Incoming("POST /x", None, face), "r1", _request())
    span.refused(Rejected("too many requests", "concurrency", 1))
    span.refused(Rejected("again", "concurrency", 1))  # ending twice records once
    (done,) = _only(spans, SpanKind.SERVER)
    assert done.attributes["omnistream.outcome"] == "refused"
    assert done.attributes[status_attribute] == value
    assert done.status.status_code == StatusCode.ERROR and done.attributes["error.type"] == "overloaded"


def test_a_client_gone_while_queued_ends_its_span_cancelled(spans):
    span = tracing.RequestSpan(tracing.Incoming("POST /x"), "r2", _request())
    span.refused(asyncio.CancelledError())
    (done,) = _only(spans, SpanKind.SERVER)
    assert done.attributes["omnistream.outcome"] == "cancelled"
    assert [e.name for e in done.events] == ["cancelled"] and done.status.status_code != StatusCode.ERROR


def test_a_stage_failure_fails_that_call_and_cancels_the_others(spans):
    span = tracing.RequestSpan(tracing.Incoming("POST /x"), "r3", _request())
    calls = span.stage_calls(
        {"thinker": "127.0.0.1:1", "talker": "127.0.0.1:2", "code2wav": "127.0.0.1:3"}, "r3"
    )
    assert calls is not None
    for stage in ("thinker", "talker", "code2wav"):
        metadata = dict(calls.metadata(stage))
        assert "traceparent" in metadata  # what the stage continues
    error = Unavailable("talker: connection to the stage lost", stage="talker")
    calls.end(error, {})
    span.finish(_Session(status="unavailable", error=error, timings=_Timings(first_text=10.2, ended=10.5)))
    clients = {s.attributes["omnistream.stage"]: s for s in _only(spans, SpanKind.CLIENT)}
    assert clients["talker"].attributes["omnistream.outcome"] == "failed"
    assert clients["talker"].attributes["rpc.grpc.status_code"] == 14  # UNAVAILABLE
    assert {clients[s].attributes["omnistream.outcome"] for s in ("thinker", "code2wav")} == {"cancelled"}
    (server,) = _only(spans, SpanKind.SERVER)
    assert all(c.parent.span_id == server.context.span_id for c in clients.values())
    assert server.status.status_code == StatusCode.ERROR and server.attributes["error.type"] == "unavailable"
    assert server.attributes["gen_ai.latency.time_to_first_token"] == pytest.approx(0.2)
    assert server.attributes["gen_ai.latency.e2e"] == pytest.approx(0.5)


def test_a_request_past_its_deadline_ends_failed_with_the_deadline(spans):
    span = tracing.RequestSpan(tracing.Incoming("omni.v1.Gateway/Generate", None, "grpc"), "r4", _request())
    error = DeadlineExceeded("the request's timeout of 1 s passed")
    span.finish(_Session(status=error.kind, error=error, timings=_Timings(ended=11.0)))
    (server,) = _only(spans, SpanKind.SERVER)
    assert server.attributes["omnistream.outcome"] == "deadline_exceeded"
    assert server.attributes["rpc.grpc.status_code"] == 4  # DEADLINE_EXCEEDED
    assert server.status.status_code == StatusCode.ERROR


def test_a_request_that_ran_to_its_end_records_its_usage(spans):
    span = tracing.RequestSpan(tracing.Incoming("POST /x"), "r5", _request())
    done = DoneEvent([1, 2, 3], [4, 5], "stop", 0, 0, 0.1, None, 0.3, cached_tokens=2)
    span.finish(_Session(status="ok", done=done, timings=_Timings(first_text=10.1, ended=10.3)))
    (server,) = _only(spans, SpanKind.SERVER)
    a = server.attributes
    assert (
        a["gen_ai.usage.prompt_tokens"],
        a["gen_ai.usage.completion_tokens"],
        a["gen_ai.usage.cached_tokens"],
    ) == (3, 2, 2)
    assert a["omnistream.outcome"] == "ok" and server.status.status_code != StatusCode.ERROR


def test_a_stage_moved_to_a_sibling_shows_both_replicas(spans):
    """A talker lost and the request gone on at a sibling (gateway/serving/resume.py): the lost call's
    span ends failed naming the first replica, a new CLIENT span names the sibling, and the request's
    span has a resume event naming both."""
    span = tracing.RequestSpan(tracing.Incoming("POST /x"), "r6", _request())
    peers = {"thinker": "127.0.0.1:1", "talker": "127.0.0.1:2", "code2wav": "127.0.0.1:3"}
    calls = span.stage_calls(peers, "r6")
    assert calls is not None
    for stage in peers:
        calls.metadata(stage)
    error = Unavailable("talker: connection to the stage lost", stage="talker")
    assert "traceparent" in dict(calls.moved("talker", "127.0.0.1:4", error))
    span.resumed("talker", "127.0.0.1:2", "127.0.0.1:4", error)
    calls.end(None, {})
    span.finish(_Session(status="ok", done=None, timings=_Timings(first_text=10.1, ended=10.3)))
    talkers = [s for s in _only(spans, SpanKind.CLIENT) if s.attributes["omnistream.stage"] == "talker"]
    assert [(s.attributes["server.port"], s.attributes["omnistream.outcome"]) for s in talkers] == [
        (2, "failed"),
        (4, "ok"),
    ]
    (server,) = _only(spans, SpanKind.SERVER)
    (event,) = [e for e in server.events if e.name == "resume"]
    assert (event.attributes["omnistream.resume.from"], event.attributes["omnistream.resume.to"]) == (
        "127.0.0.1:2",
        "127.0.0.1:4",
    )
