"""The gateway core when a call to a thinker replica fails before any output: gRPC's own INTERNAL for a
broken link ("Internal error from Core", no stage marker) takes the replica out of rotation and the
request moves to the other replica; the stage's own INTERNAL is the request's answer, as it is.

Fake thinker stubs stand in for the replicas' channels (no stage runs); the core, its replica set,
the session and `run_stages` are the real ones."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2
from prometheus_client import generate_latest

from gateway.config import GatewayConfig
from gateway.serving.core import GatewayCore
from omnistream.proto.omni.v1 import stage_pb2
from omnistream.request.errors import OmniError
from omnistream.request.generation import DoneEvent, GenerationRequest, TextEvent
from omnistream.service.server import ERROR_KIND_METADATA_KEY, STAGE_ORIGIN, STATUS_ORIGIN_METADATA_KEY
from tests.unit.gateway.infos import stage_info


class FakeHealth:
    async def Check(self, request, timeout=None):
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


class FakeCall:
    """A thinker stream that answers one finished chunk, or fails with `error` when read."""

    def __init__(self, error: grpc.aio.AioRpcError | None) -> None:
        self.error = error

    async def write(self, message) -> None:
        pass

    async def done_writing(self) -> None:
        pass

    def cancel(self) -> bool:
        return True

    def __aiter__(self):
        return self._chunks()

    async def _chunks(self):
        if self.error is not None:
            raise self.error
        yield stage_pb2.ThinkerChunk(token_ids=[7], text_delta="hi", finished=True, finish_reason="stop")


class FakeThinker:
    """A replica's Info and Stream; `errors` are what its next streams fail with (None: answers)."""

    def __init__(self, errors: list[grpc.aio.AioRpcError | None]) -> None:
        self.errors = errors
        self.streams = 0

    async def Info(self, request, timeout=None):
        return stage_info("thinker")

    def Stream(self, timeout=None) -> FakeCall:
        self.streams += 1
        return FakeCall(self.errors.pop(0) if self.errors else None)


def rpc_error(code: grpc.StatusCode, details: str, trailing=()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details, None)


async def text_core(first_error: grpc.aio.AioRpcError) -> tuple[GatewayCore, list]:
    """A text deployment over two thinkers; whichever is picked first fails with `first_error`."""
    core = GatewayCore(GatewayConfig(thinker=["127.0.0.1:1", "127.0.0.1:2"]))
    shared = [first_error]  # one list: the first stream opened on either replica fails
    for replica in core.replicas.sets["thinker"].replicas:
        replica.health, replica.stub = FakeHealth(), FakeThinker(shared)
    await core.replicas.check_all()
    assert core.ready
    return core, core.replicas.sets["thinker"].replicas


async def close(core: GatewayCore) -> None:
    for replica_set in core.replicas.sets.values():
        for replica in replica_set.replicas:
            await replica.channel.close()


def in_flight(core: GatewayCore) -> float:
    scraped = generate_latest(core.metrics.registry).decode()
    (line,) = [line for line in scraped.splitlines() if line.startswith("omnistream_requests_in_flight ")]
    return float(line.split()[1])


def text_request() -> GenerationRequest:
    messages = [{"role": "user", "content": "hi"}]
    return GenerationRequest(messages=messages, return_audio=False, max_audio_frames=8)


async def test_a_broken_link_before_any_output_moves_the_request_to_the_other_replica():
    core, replicas = await text_core(rpc_error(grpc.StatusCode.INTERNAL, "Internal error from Core"))
    try:
        session = await core.open(text_request())
        events = [event async for event in session.events()]
        assert isinstance(events[0], TextEvent) and isinstance(events[-1], DoneEvent)
        failed = [r for r in replicas if not r.healthy]
        assert len(failed) == 1, [(r.address, r.healthy) for r in replicas]  # out of rotation
        served = [r for r in replicas if r.healthy]
        assert [r.stub.streams for r in failed + served] == [1, 1]
        assert in_flight(core) == 0
    finally:
        await close(core)


async def test_the_stages_own_internal_is_the_answer_and_keeps_the_replica():
    marked = ((ERROR_KIND_METADATA_KEY, "internal"), (STATUS_ORIGIN_METADATA_KEY, STAGE_ORIGIN))
    core, replicas = await text_core(rpc_error(grpc.StatusCode.INTERNAL, "internal error (KeyError)", marked))
    try:
        with pytest.raises(OmniError) as caught:
            await core.open(text_request())
        assert caught.value.kind == "internal"
        assert caught.value.message == "thinker: internal error (KeyError)"
        assert all(r.healthy for r in replicas)
        assert sum(r.stub.streams for r in replicas) == 1  # not retried
        assert in_flight(core) == 0
    finally:
        await close(core)
