"""Where a lost audio stage of a running request goes on (gateway/serving/resume.py): a sibling in
rotation, only for a lost replica, at most `limit` times; the lost one leaves the rotation and the
request's replica list and in-flight counts follow the move. The core's real replica sets, health
answered by a fake (no stage runs)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from grpc_health.v1 import health_pb2
from prometheus_client import generate_latest

from gateway.config import GatewayConfig
from gateway.serving.core import GatewayCore
from gateway.serving.resume import Siblings
from gateway.serving.tracing import RequestSpan
from omnistream.request.errors import InternalError, Unavailable
from omnistream.request.generation import GenerationRequest
from tests.unit.gateway.infos import stage_info


class FakeStage:
    def __init__(self, stage: str) -> None:
        self.stage = stage

    async def Check(self, request, timeout=None):
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def Info(self, request, timeout=None):
        return stage_info(self.stage)


@contextlib.asynccontextmanager
async def audio_core(talkers: int) -> AsyncIterator[GatewayCore]:
    """An audio deployment with `talkers` talker replicas, all healthy; its channels closed after."""
    core = GatewayCore(
        GatewayConfig(
            thinker=["127.0.0.1:1"],
            talker=[f"127.0.0.1:{10 + n}" for n in range(talkers)],
            code2wav=["127.0.0.1:20"],
        )
    )
    for stage, replica_set in core.replicas.sets.items():
        for replica in replica_set.replicas:
            replica.health = replica.stub = FakeStage(stage)
    await core.replicas.check_all()
    assert core.readiness.ready
    try:
        yield core
    finally:
        for replica_set in core.replicas.sets.values():
            for replica in replica_set.replicas:
                await replica.channel.close()


def siblings(core: GatewayCore, limit: int = 2) -> tuple[Siblings, list]:
    serving = [core.replicas.pick(stage) for stage in ("thinker", "talker", "code2wav")]
    for replica in serving:
        replica.inflight += 1
    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}])
    span = RequestSpan(None, "r1", request)
    return Siblings(core.replicas, serving, core.metrics, span, "r1", limit), serving


def resumes(core: GatewayCore, outcome: str) -> float:
    for line in generate_latest(core.metrics.registry).decode().splitlines():
        if line.startswith("omnistream_gateway_resumes_total{") and f'outcome="{outcome}"' in line:
            return float(line.split()[-1])
    return 0.0


LOST = Unavailable("talker: connection to the stage lost (UNAVAILABLE: reset)", stage="talker")


async def test_a_lost_talker_moves_to_its_sibling_which_now_serves_the_request():
    async with audio_core(talkers=2) as core:
        moves, serving = siblings(core)
        lost = serving[1]
        sibling = moves.take("talker", LOST)
        assert sibling is not None and sibling is not lost
        assert not lost.healthy  # out of rotation: its other requests and new ones go elsewhere
        assert serving[1] is sibling and (lost.inflight, sibling.inflight) == (0, 1)
        assert moves.moves == 1 and resumes(core, "resumed") == 1


async def test_no_sibling_or_no_move_left_keeps_the_loss_as_the_answer():
    async with audio_core(talkers=1) as core:
        moves, serving = siblings(core)
        assert moves.take("talker", LOST) is None
        assert resumes(core, "no_sibling") == 1 and not serving[1].healthy
    async with audio_core(talkers=3) as core:
        moves, serving = siblings(core, limit=1)
        assert moves.take("talker", LOST) is not None
        assert moves.take("talker", LOST) is None  # its one move is made
        assert resumes(core, "limit") == 1 and moves.moves == 1


async def test_only_a_lost_replica_of_that_stage_moves():
    async with audio_core(talkers=2) as core:
        moves, serving = siblings(core)
        assert moves.take("talker", InternalError("talker: internal error", stage="talker")) is None
        assert moves.take("talker", Unavailable("code2wav: lost", stage="code2wav")) is None
        assert all(r.healthy for r in serving) and moves.moves == 0
