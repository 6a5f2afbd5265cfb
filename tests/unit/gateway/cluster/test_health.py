"""A replica's health round: which answers take it out of rotation, and when (a scripted health
service, no RPC; Info reads stubbed)."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2

from gateway.cluster import health
from gateway.cluster.replica import Replica
from tests.unit.gateway.infos import stage_info


class FakeHealth:
    """A stage's health service answering from a script: a status name, or a gRPC code raised."""

    def __init__(self, answers: list[str | grpc.StatusCode]) -> None:
        self.answers = list(answers)

    async def Check(self, request, timeout: float):  # the gRPC method's name
        answer = self.answers.pop(0)
        if isinstance(answer, grpc.StatusCode):
            raise grpc.aio.AioRpcError(answer, grpc.aio.Metadata(), grpc.aio.Metadata(), details="scripted")
        return health_pb2.HealthCheckResponse(
            status=health_pb2.HealthCheckResponse.ServingStatus.Value(answer)
        )


def health_scripted(monkeypatch, answers: list[str | grpc.StatusCode]) -> Replica:
    """One healthy, accepted thinker replica whose next health checks answer `answers` (Info reads
    stubbed: this is about the health verdict)."""

    async def nothing(replica, *timeout) -> None:
        return None

    monkeypatch.setattr(health, "read_info", nothing)
    monkeypatch.setattr(health, "read_load", nothing)
    replica = Replica("thinker", "10.0.0.7:50051", None, None, FakeHealth(answers))  # type: ignore[arg-type]
    replica.healthy, replica.accepted, replica.info = True, True, stage_info("thinker")
    return replica


async def test_a_replica_leaves_after_checks_that_time_out_in_a_row_not_after_one(monkeypatch):
    slow = grpc.StatusCode.DEADLINE_EXCEEDED
    leave = health.MISSED_CHECKS_TO_LEAVE
    replica = health_scripted(monkeypatch, [slow] * (leave - 1) + ["SERVING"] + [slow] * leave)
    for _ in range(leave - 1):  # slow answers under load: it stays in rotation
        await health.check(replica)
        assert replica.in_rotation
    await health.check(replica)  # an answer resets the count
    assert replica.in_rotation and replica.missed_checks == 0
    for _ in range(leave - 1):
        await health.check(replica)
    assert replica.in_rotation
    await health.check(replica)  # the last of `leave` in a row: a hung stage is out
    assert not replica.healthy and not replica.in_rotation


@pytest.mark.parametrize("answer", ["NOT_SERVING", grpc.StatusCode.UNAVAILABLE])
async def test_a_draining_or_unreachable_replica_leaves_at_once(monkeypatch, answer):
    replica = health_scripted(monkeypatch, [answer])
    await health.check(replica)
    assert not replica.healthy and not replica.in_rotation


async def test_an_unhealthy_replica_that_times_out_stays_out(monkeypatch):
    replica = health_scripted(monkeypatch, [grpc.StatusCode.DEADLINE_EXCEEDED])
    replica.healthy = False
    await health.check(replica)
    assert not replica.healthy and replica.missed_checks == 0
