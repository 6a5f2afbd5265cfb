"""Replica choice: each request goes to the least-loaded healthy replica of each stage.

A replica leaves the rotation when its health check fails or a call to it fails with UNAVAILABLE,
and comes back as soon as its health check answers SERVING again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from omnistream.errors import Unavailable
from omnistream.proto.omni.v1 import stage_pb2_grpc
from omnistream.server import client_channel_options

log = logging.getLogger(__name__)

STUBS = {
    "thinker": stage_pb2_grpc.ThinkerServiceStub,
    "talker": stage_pb2_grpc.TalkerServiceStub,
    "code2wav": stage_pb2_grpc.Code2WavServiceStub,
}


@dataclass
class Replica:
    stage: str
    address: str
    channel: grpc.aio.Channel
    stub: object
    health: health_pb2_grpc.HealthStub
    healthy: bool = False
    inflight: int = 0
    served: int = 0


@dataclass
class ReplicaSet:
    stage: str
    replicas: list[Replica] = field(default_factory=list)

    def pick(self) -> Replica:
        healthy = [r for r in self.replicas if r.healthy]
        if not healthy:
            raise Unavailable(f"no healthy {self.stage} replica")
        return min(healthy, key=lambda r: (r.inflight, r.served))

    @property
    def any_healthy(self) -> bool:
        return any(r.healthy for r in self.replicas)


class Replicas:
    """All stages' replica sets plus the health watcher that keeps their state current."""

    def __init__(
        self, addresses: dict[str, list[str]], max_message_bytes: int, check_interval: float = 1.0
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.check_interval = check_interval
        self.sets = {stage: ReplicaSet(stage) for stage in STUBS}
        for stage, addrs in addresses.items():
            for address in addrs:
                self.add(stage, address)
        self._task: asyncio.Task | None = None
        self._closing: set[asyncio.Task] = set()

    def add(self, stage: str, address: str) -> Replica:
        channel = grpc.aio.insecure_channel(address, options=client_channel_options(self.max_message_bytes))
        replica = Replica(stage, address, channel, STUBS[stage](channel), health_pb2_grpc.HealthStub(channel))
        self.sets[stage].replicas.append(replica)
        return replica

    def remove(self, stage: str, address: str) -> None:
        keep = []
        for replica in self.sets[stage].replicas:
            if replica.address == address:
                task = asyncio.ensure_future(replica.channel.close(grace=30))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            else:
                keep.append(replica)
        self.sets[stage].replicas = keep

    def pick(self, stage: str) -> Replica:
        return self.sets[stage].pick()

    @property
    def ready(self) -> bool:
        return all(s.any_healthy for s in self.sets.values())

    def mark_failed(self, replica: Replica) -> None:
        if replica.healthy:
            log.warning(
                "%s replica %s failed a call: out of rotation until healthy", replica.stage, replica.address
            )
        replica.healthy = False

    async def check(self, replica: Replica) -> None:
        try:
            reply = await replica.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            ok = reply.status == health_pb2.HealthCheckResponse.SERVING
        except (grpc.aio.AioRpcError, TimeoutError):
            ok = False
        if ok != replica.healthy:
            log.info(
                "%s replica %s is now %s", replica.stage, replica.address, "healthy" if ok else "unhealthy"
            )
        replica.healthy = ok

    async def check_all(self) -> None:
        replicas = [r for s in self.sets.values() for r in s.replicas]
        await asyncio.gather(*(self.check(r) for r in replicas))

    async def _watch(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self.check_interval)

    async def start(self) -> None:
        await self.check_all()
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for s in self.sets.values():
            for r in s.replicas:
                await r.channel.close()

    def snapshot(self) -> dict[str, list[dict]]:
        return {
            stage: [
                {"address": r.address, "healthy": r.healthy, "inflight": r.inflight, "served": r.served}
                for r in s.replicas
            ]
            for stage, s in self.sets.items()
        }
