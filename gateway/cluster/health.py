"""A replica's health round: is it in rotation, and what is its measured speed now.

A replica leaves the rotation when its health check fails, and comes back as soon as it answers
SERVING again. A check that only timed out is a slow answer, not a failure, until
`MISSED_CHECKS_TO_LEAVE` in a row have: on a loaded machine one check can wait its whole timeout (a
stage's health took 0.95 s beside a vLLM start on 2 cores), and with one replica a stage, that one
check would refuse every audio request until the next round. A stage that says NOT_SERVING
(draining) or cannot be reached leaves at once.

The Info is read whenever a replica becomes healthy (first seen, or back after a failure: it may be
another process now); one that cannot answer it stays out until a later round gets an answer. Every
later round of a healthy replica reads its Info again for the one part that changes, its measured
speed (`StageInfo.load`, see omnistream/service/speed.py), which admission uses
(gateway/admission/audio_capacity.py); its identity is not judged again (the process is the same
one as long as its health never failed). A stage too old to report a load, or one whose Info fails
in a round, has no load until it reports one: its speed is unknown.
"""

from __future__ import annotations

import logging

import grpc
from grpc_health.v1 import health_pb2  # type: ignore[import-untyped]  # grpcio-health-checking ships no stubs

from gateway.cluster.deployment import StageInfo
from gateway.cluster.replica import Replica
from omnistream.proto.omni.v1 import stage_pb2

log = logging.getLogger(__name__)

INFO_TIMEOUT = 5.0  # seconds a replica has to answer Info before it stays out for this round
HEALTH_TIMEOUT = 2.0  # seconds a replica has to answer a health check
LOAD_TIMEOUT = HEALTH_TIMEOUT  # seconds for the per-round Info read of the load
MISSED_CHECKS_TO_LEAVE = 3  # health checks in a row that time out before a healthy replica leaves


def load_of(info: StageInfo) -> stage_pb2.StageLoad | None:
    """The load an Info carries; None from a stage that predates the field."""
    return info.load if info.HasField("load") else None


async def check(replica: Replica, info_timeout: float = INFO_TIMEOUT) -> None:
    """One health round of `replica`: its verdict (healthy or not, see above), then its Info (when it
    just became healthy) or its load (when it stayed so)."""
    timed_out = False
    try:
        request = health_pb2.HealthCheckRequest(service="")
        reply = await replica.health.Check(request, timeout=HEALTH_TIMEOUT)
        ok = reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.aio.AioRpcError as exc:
        ok, timed_out = False, exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    except TimeoutError:
        ok, timed_out = False, True
    if timed_out and replica.healthy:
        replica.missed_checks += 1
        if replica.missed_checks < MISSED_CHECKS_TO_LEAVE:
            log.info(
                "%s replica %s: health check timed out (%d of %d in a row before it leaves)",
                replica.stage,
                replica.address,
                replica.missed_checks,
                MISSED_CHECKS_TO_LEAVE,
            )
            return  # still in rotation, with the load of its last answer
    replica.missed_checks = 0
    if ok and (not replica.healthy or replica.info is None):
        await read_info(replica, info_timeout)
    elif ok:
        await read_load(replica)
    else:
        replica.load = None
    if ok != replica.healthy:
        log.info("%s replica %s is now %s", replica.stage, replica.address, "healthy" if ok else "unhealthy")
    replica.healthy = ok


async def read_info(replica: Replica, timeout: float = INFO_TIMEOUT) -> None:
    """Read the replica's Info; on failure it has none (out of rotation) until a later round."""
    replica.accepted = False  # until `judge` has seen what it says now
    try:
        info = await replica.stub.Info(stage_pb2.InfoRequest(), timeout=timeout)
        replica.load = load_of(info)
        info.ClearField("load")  # the identity only: a load kept here (or in the deployment) goes stale
        replica.info = info
        replica.info_error = None
    except (grpc.aio.AioRpcError, TimeoutError) as exc:
        replica.info = None
        replica.load = None
        error = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else "timed out"
        if error != replica.info_error:
            log.warning(
                "%s replica %s: cannot read its Info (%s); out of rotation until it answers",
                replica.stage,
                replica.address,
                error,
            )
        replica.info_error = error


async def read_load(replica: Replica) -> None:
    """Refresh the replica's measured speed from a new Info; a failed read forgets it (unknown)
    and is not a health failure (the health check decides that)."""
    try:
        info = await replica.stub.Info(stage_pb2.InfoRequest(), timeout=LOAD_TIMEOUT)
    except (grpc.aio.AioRpcError, TimeoutError):
        replica.load = None
        return
    replica.load = load_of(info)
