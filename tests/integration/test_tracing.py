"""OpenTelemetry traces across the four processes of `omnistream up`, received by an OTLP/gRPC
collector built here on opentelemetry-proto's trace service (what a real collector speaks), not the
SDK's in-memory exporter: what is checked is what leaves each process.

One stack for the module, `up --otlp-traces-endpoint http://127.0.0.1:<receiver>`: a streamed chat
completion with audio continuing the client's `traceparent`, a request the client drops after its
first audio chunk, a gRPC API call and a realtime turn (the WebSocket upgrade's `traceparent`), each
a tree of one trace id: the gateway's SERVER span (its parent: the client's span), a CLIENT span per
stage call under it, and each stage's SERVER span under its CLIENT span, from its own process. Last,
the collector goes away: requests still succeed and the stack stops as promptly as ever.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from threading import Lock
from typing import Any

import grpc
import httpx
import pytest
import websockets
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from omnistream.cli.up import DRAIN_TIMEOUT_S
from omnistream.proto.omni.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.integration.test_up import SERVING, run_up
from tests.procs import wait_until

SERVICES = ("omnistream-gateway", "omnistream-thinker", "omnistream-talker", "omnistream-code2wav")
STAGES = ("thinker", "talker", "code2wav")
STAGE_SERVICES = {"thinker": "ThinkerService", "talker": "TalkerService", "code2wav": "Code2WavService"}
SPAN_WAIT_S = 30.0
STOP_TIMEOUT_S = DRAIN_TIMEOUT_S  # `up`'s own bound on one group's stop (omnistream/cli/up.py)
SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind
# Seeded: the tiny checkpoint samples its end of text or of speech now and then (temperature 1.0),
# and these spans are checked for 4 tokens and 8 frames.
SEED = 5
SMALL = {"max_tokens": 4, "max_audio_frames": 8, "modalities": ["text", "audio"], "seed": SEED}
AUDIO = {"voice": "ethan", "format": "pcm16"}


@dataclass
class Span:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    events: list[str]


def _value(any_value) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """The collector: every span of every ExportTraceServiceRequest, with its resource's service.name."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = Lock()

    def Export(self, request, context):
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for s in scope.spans:
                    span = Span(
                        resource.get("service.name", ""),
                        s.name,
                        s.kind,
                        s.trace_id.hex(),
                        s.span_id.hex(),
                        s.parent_span_id.hex(),
                        {a.key: _value(a.value) for a in s.attributes},
                        s.status.code,
                        s.status.message,
                        [e.name for e in s.events],
                    )
                    with self._lock:
                        self.spans.append(span)
        return trace_service_pb2.ExportTraceServiceResponse()

    def of(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait(self, trace_id: str, ready: Callable[[list[Span]], bool]) -> list[Span]:
        """The trace's spans once `ready` holds of them (spans come in batches, process by process)."""
        assert wait_until(lambda: ready(self.of(trace_id)), SPAN_WAIT_S, 0.1), self.of(trace_id)
        return self.of(trace_id)


@dataclass
class Stack:
    receiver: Receiver
    server: grpc.Server
    up: Any
    http_port: int
    grpc_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory) -> Iterator[Stack]:
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name in (
                "OTEL_TRACES_EXPORTER",
                "OTEL_SDK_DISABLED",
                "OTEL_SERVICE_NAME",
                "OTEL_PROPAGATORS",
            ):
                mp.delenv(name, raising=False)
            mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # ms between batches: spans arrive at once
            endpoint = f"http://127.0.0.1:{port}"
            args = ("--http-port", "0", "--grpc-port", "0", "--otlp-traces-endpoint", endpoint)
            with run_up(tmp_path_factory.mktemp("tracing"), tiny_model_dir, *args) as up:
                match, _ = up.wait_for(SERVING)
                yield Stack(receiver, server, up, int(match.group(1)), int(match.group(2)))
    finally:
        server.stop(0)


def traceparent() -> tuple[str, str, str]:
    """(trace id, span id, header) of a client span of the test's own."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def complete_tree(spans: list[Span]) -> bool:
    """The gateway's request span and, for each stage, its CLIENT and SERVER spans."""
    return len([s for s in spans if s.kind == SERVER and s.service == SERVICES[0]]) == 1 and all(
        any(s.kind == CLIENT and s.attributes.get("omnistream.stage") == stage for s in spans)
        and any(s.kind == SERVER and s.service == f"omnistream-{stage}" for s in spans)
        for stage in STAGES
    )


def check_tree(
    spans: list[Span], client_span_id: str, name: str
) -> tuple[Span, dict[str, Span], dict[str, Span]]:
    """One trace id across the four processes, parented as the module docstring says; returns the
    request span, the CLIENT spans by stage and the stage SERVER spans by stage."""
    assert {s.service for s in spans} == set(SERVICES)
    assert len({s.trace_id for s in spans}) == 1
    (request,) = [s for s in spans if s.kind == SERVER and s.service == SERVICES[0]]
    assert request.name == name and request.parent_id == client_span_id
    calls = {s.attributes["omnistream.stage"]: s for s in spans if s.kind == CLIENT}
    served = {s.attributes["omnistream.stage"]: s for s in spans if s.kind == SERVER and s is not request}
    assert set(calls) == set(served) == set(STAGES)
    for stage in STAGES:
        call, stage_span = calls[stage], served[stage]
        assert call.service == SERVICES[0] and call.parent_id == request.span_id
        assert call.name == stage_span.name == f"omni.v1.{STAGE_SERVICES[stage]}/Stream"
        assert stage_span.service == f"omnistream-{stage}" and stage_span.parent_id == call.span_id
        assert stage_span.attributes["gen_ai.request.id"] == call.attributes["gen_ai.request.id"]
    return request, calls, served


def check_ok(request: Span, calls: dict[str, Span], served: dict[str, Span]) -> None:
    a = request.attributes
    for key in (
        "gen_ai.request.id",
        "gen_ai.usage.prompt_tokens",
        "gen_ai.latency.time_to_first_token",
        "gen_ai.latency.e2e",
        "gen_ai.latency.time_in_queue",
        "gen_ai.request.temperature",
        "gen_ai.request.top_p",
        "gen_ai.response.model",
        "omnistream.audio.time_to_first_audio",
        "omnistream.audio.seconds",
        "omnistream.audio.stalls",
        "omnistream.audio.underrun",
        "omnistream.audio.first_chunk_frames",
        "omnistream.audio.held",
    ):
        assert key in a, key
    assert a["omnistream.outcome"] == "ok" and request.status_code != 2
    assert a["gen_ai.request.max_tokens"] == 4 and a["gen_ai.usage.completion_tokens"] == 4
    assert (
        a["omnistream.audio.seconds"] > 0
        and a["gen_ai.latency.e2e"] >= a["gen_ai.latency.time_to_first_token"]
    )
    for stage in STAGES:
        assert calls[stage].attributes["omnistream.outcome"] == "ok"
        s = served[stage].attributes
        assert s["omnistream.outcome"] == "ok" and s["rpc.grpc.status_code"] == 0, (stage, s)
        assert s["omnistream.stage.chunks_out"] >= 1 and s["omnistream.stage.time_in_open"] >= 0
        assert "omnistream.stage.time_to_first_chunk" in s
    assert served["thinker"].attributes["gen_ai.usage.completion_tokens"] == 4
    assert served["talker"].attributes["omnistream.audio.frames"] == 8
    assert served["code2wav"].attributes["omnistream.audio.samples"] > 0


def test_a_streamed_chat_with_audio_is_one_trace_across_the_four_processes(stack):
    trace_id, span_id, header = traceparent()
    body = {"messages": [{"role": "user", "content": "Hello"}], "audio": AUDIO, "stream": True, **SMALL}
    with httpx.stream(
        "POST", f"{stack.url}/v1/chat/completions", json=body, headers={"traceparent": header}, timeout=60
    ) as reply:
        assert reply.status_code == 200
        text = "".join(reply.iter_text())
    assert text.rstrip().endswith("data: [DONE]")
    spans = stack.receiver.wait(trace_id, complete_tree)
    request, calls, served = check_tree(spans, span_id, "POST /v1/chat/completions")
    check_ok(request, calls, served)
    assert request.attributes["http.route"] == "/v1/chat/completions"
    assert calls["thinker"].attributes["server.port"] > 0


def test_a_client_that_leaves_mid_stream_ends_every_span_with_the_cancel(stack):
    trace_id, span_id, header = traceparent()
    long = {"max_tokens": 400, "max_audio_frames": 1000, "modalities": ["text", "audio"]}
    body = {
        "messages": [{"role": "user", "content": "Tell me everything."}],
        "audio": AUDIO,
        "stream": True,
        **long,
    }
    with httpx.stream(
        "POST", f"{stack.url}/v1/chat/completions", json=body, headers={"traceparent": header}, timeout=60
    ) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                "audio", {}
            ).get("data"):
                break  # the first audio chunk: leave
    spans = stack.receiver.wait(trace_id, complete_tree)  # every span arrives: every span ended
    request, calls, served = check_tree(spans, span_id, "POST /v1/chat/completions")
    assert request.attributes["omnistream.outcome"] == "cancelled" and "cancelled" in request.events
    assert (
        request.attributes["omnistream.audio.seconds"] > 0 and "gen_ai.latency.e2e" not in request.attributes
    )
    for stage in STAGES:
        assert calls[stage].attributes["omnistream.outcome"] == "cancelled", stage
        assert calls[stage].attributes["rpc.grpc.status_code"] == 1
    # The audio stages were still at work (1000 frames take far longer than the first chunk).
    for stage in ("talker", "code2wav"):
        s = served[stage].attributes
        assert s["omnistream.outcome"] == "cancelled" and s["rpc.grpc.status_code"] == 1, (stage, s)
        assert "cancelled" in served[stage].events


def test_a_grpc_api_call_continues_its_metadata_traceparent(stack):
    trace_id, span_id, header = traceparent()
    request = gateway_pb2.GenerateRequest(
        messages=[common_pb2.Message(role="user", content="Hello")],
        max_tokens=4,
        max_audio_frames=8,
        sampling=common_pb2.Sampling(temperature=1.0, top_p=1.0, seed=SEED),
    )
    with grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
        events = list(
            gateway_pb2_grpc.GatewayStub(channel).Generate(request, metadata=[("traceparent", header)])
        )
    assert events and events[-1].WhichOneof("event") == "end"
    spans = stack.receiver.wait(trace_id, complete_tree)
    request_span, calls, served = check_tree(spans, span_id, "omni.v1.Gateway/Generate")
    check_ok(request_span, calls, served)
    assert request_span.attributes["rpc.grpc.status_code"] == 0


def test_a_realtime_turn_continues_the_upgrades_traceparent(stack):
    trace_id, span_id, header = traceparent()

    async def turn() -> dict:
        url = f"ws://127.0.0.1:{stack.http_port}/v1/realtime?model=omnistream"
        async with websockets.connect(url, additional_headers={"traceparent": header}, max_size=None) as ws:

            async def until(kind: str) -> dict:
                async with asyncio.timeout(60):
                    while True:
                        event = json.loads(await ws.recv())
                        if event["type"] == kind:
                            return event

            await until("session.created")
            session = {
                "type": "realtime",
                "audio": {"input": {"turn_detection": None}},
                "max_output_tokens": 4,
            }
            session["omnistream"] = {"max_audio_frames": 8, "seed": SEED}
            await ws.send(json.dumps({"type": "session.update", "session": session}))
            await until("session.updated")
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]}
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            await ws.send(json.dumps({"type": "response.create"}))
            return await until("response.done")

    done = asyncio.run(turn())
    assert done["response"]["status"] in ("completed", "incomplete"), done
    spans = stack.receiver.wait(trace_id, complete_tree)
    request, calls, served = check_tree(spans, span_id, "realtime response")
    assert request.attributes["omnistream.realtime.response_id"] == done["response"]["id"]
    check_ok(request, calls, served)


def test_a_dead_collector_costs_requests_nothing_and_the_stack_stops_promptly(stack):
    """Last in the module: it stops the collector, then the stack."""
    stack.server.stop(0).wait()
    body = {"messages": [{"role": "user", "content": "Hello"}], "audio": AUDIO, **SMALL}
    for _ in range(2):
        reply = httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["audio"]["data"]
    # Spans of those are queued (or on their way to nowhere) in every process as they are asked to
    # stop: each gives up on them within its tracing shutdown bound, so `up` stops within the drain
    # bound it always has (its services are idle: their drains are immediate).
    stack.up.proc.send_signal(signal.SIGTERM)
    assert stack.up.proc.wait(STOP_TIMEOUT_S) == 0
    assert wait_until(lambda: not stack.up.pids(), 10), stack.up.pids()


pytestmark = pytest.mark.timeout(300)
