"""The gateway's replicas of every stage, kept current: found, health-checked, judged, removed.

A request goes to the least-loaded replica in rotation of each stage (`gateway.cluster.replica`). A
replica leaves the rotation when a call to it fails with UNAVAILABLE or its health round says so
(`gateway.cluster.health`: the timeouts, and when a slow answer is not yet a failure), and comes back
as soon as its health check answers SERVING again.

Replicas come from the configured entries of each stage (parsed and looked up in
gateway/cluster/discovery.py). An IP literal (`10.0.0.7:50051`, `[fd00::7]:50051`) or a `unix:` path
is one static replica. A DNS name (`talker:50051`, or explicitly `dns:///talker.omnistream.svc:50051`)
is looked up every `discovery_interval` seconds and every address it resolves to is a replica: a
Kubernetes headless Service (or a Compose service with several replicas) answers with one address
per ready pod, so scaling a stage needs no gateway restart. Addresses that appear are added (and
health-checked at once), addresses that vanish are removed after their running requests finish; a
failed look-up keeps the replicas known so far.

A replica joins the rotation only once the gateway has its Info and the deployment accepted it (see
`gateway.cluster.deployment`); every round judges the Info of every healthy replica again, stages in
pipeline order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc  # type: ignore[import-untyped]  # grpcio-health-checking ships no stubs

from gateway.cluster import health
from gateway.cluster.deployment import Deployment
from gateway.cluster.discovery import Resolver, Target, resolve_addresses
from gateway.cluster.replica import Replica, ReplicaSet
from omnistream.proto.omni.v1 import stage_pb2, stage_pb2_grpc
from omnistream.service.security import open_channel
from omnistream.service.server import client_channel_options

log = logging.getLogger(__name__)

# Each stage's generated stub class (grpc's *_pb2_grpc.py come untyped, without .pyi).
STUBS: dict[str, Callable[[grpc.aio.Channel], Any]] = {
    "thinker": stage_pb2_grpc.ThinkerServiceStub,
    "talker": stage_pb2_grpc.TalkerServiceStub,
    "code2wav": stage_pb2_grpc.Code2WavServiceStub,
}


class Replicas:
    """All stages' replica sets plus the health watcher that keeps their state current."""

    def __init__(
        self,
        addresses: dict[str, list[str]],
        max_message_bytes: int,
        check_interval: float = 1.0,
        *,
        discovery_interval: float = 5.0,
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str | None = None,
        resolver: Resolver = resolve_addresses,
        deployment: Deployment | None = None,
        info_timeout: float = health.INFO_TIMEOUT,
    ) -> None:
        """`credentials`: TLS to the stages (None: plaintext); `server_name`: the name their
        certificates carry (default: the dialled IP for static entries, the DNS name for the others);
        `deployment`: what the replicas must agree with (learned from them when not given)."""
        self.deployment = deployment if deployment is not None else Deployment()
        self.info_timeout = info_timeout
        self.max_message_bytes = max_message_bytes
        self.check_interval = check_interval
        self.discovery_interval = discovery_interval
        self.credentials = credentials
        self.server_name = server_name
        self.resolver = resolver
        self.sets = {stage: ReplicaSet(stage) for stage in STUBS}
        self.deployment.thinker_modalities = self.sets["thinker"].input_modalities
        self.deployment.thinker_max_model_len = self.sets["thinker"].max_model_len
        self.targets = [
            Target.parse(stage, entry) for stage, entries in addresses.items() for entry in entries
        ]
        for target in self.targets:
            if not target.dynamic:
                self.add(target.stage, target.address)
        self._task: asyncio.Task[None] | None = None
        self._discovery: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._releasing: set[asyncio.Task[None]] = set()  # cache scopes being released (release_cache_soon)
        # Called after every health round (the loads may have changed): admission re-checks who waits.
        self.on_load: Callable[[], None] | None = None

    def add(
        self, stage: str, address: str, *, source: str | None = None, server_name: str | None = None
    ) -> Replica:
        channel = open_channel(
            address,
            self.credentials,
            client_channel_options(self.max_message_bytes),
            self.server_name or server_name,
        )
        replica = Replica(
            stage, address, channel, STUBS[stage](channel), health_pb2_grpc.HealthStub(channel), source=source
        )
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
        if not any(r.accepted for r in keep):
            self.deployment.forget(stage)

    def pick(self, stage: str, kinds: frozenset[str] = frozenset()) -> Replica:
        return self.sets[stage].pick(kinds)

    @property
    def ready(self) -> bool:
        return all(s.any_in_rotation for s in self.sets.values())

    def mark_failed(self, replica: Replica) -> None:
        if replica.healthy:
            log.warning(
                "%s replica %s failed a call: out of rotation until healthy", replica.stage, replica.address
            )
        replica.healthy = False

    def judge_all(self) -> None:
        """Judge every healthy replica, stages in pipeline order and replicas in the order they were
        configured or found, so which info defines the deployment does not depend on which health
        check happened to answer first."""
        for stage in STUBS:
            for replica in self.sets[stage].replicas:
                self.judge(replica)

    def judge(self, replica: Replica) -> None:
        """Accept or refuse the replica's info against the deployment; log only what changed."""
        if not replica.healthy or replica.info is None:
            return
        reason = self.deployment.admit(replica.stage, replica.info)
        if reason is None and not replica.accepted:
            log.info(
                "%s replica %s accepted (model %r)", replica.stage, replica.address, replica.info.model_id
            )
        elif reason is not None and reason != replica.refused:
            log.warning("%s replica %s refused: %s", replica.stage, replica.address, reason)
        replica.refused = reason
        replica.accepted = reason is None

    async def release_cache(self, scope: bytes, timeout: float = 5.0) -> None:
        """A prefix cache scope ended (a realtime session closed): every thinker and talker replica
        drops what it cached for it (ReleaseCache). Best effort: a replica that cannot be told
        (down, or an older stage without the RPC) keeps those blocks until its LRU budget evicts
        them; nothing else depends on it."""

        async def release(replica: Replica) -> None:
            try:
                request = stage_pb2.ReleaseCacheRequest(cache_scope=scope)
                await replica.stub.ReleaseCache(request, timeout=timeout)
            except (grpc.aio.AioRpcError, TimeoutError) as exc:
                error = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else "timed out"
                log.info(
                    "%s replica %s: its cache scope was not released (%s)",
                    replica.stage,
                    replica.address,
                    error,
                )

        targets = [
            r for stage in ("thinker", "talker") if stage in self.sets for r in self.sets[stage].replicas
        ]
        await asyncio.gather(*(release(r) for r in targets if r.healthy))

    def release_cache_soon(self, scope: bytes) -> None:
        """`release_cache` in the background: a closing session does not wait on the stages (its
        slot is free at once; the release lands before their next step)."""
        task = asyncio.get_running_loop().create_task(self.release_cache(scope))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def check_all(self) -> None:
        replicas = [r for s in self.sets.values() for r in s.replicas]
        await asyncio.gather(*(health.check(r, self.info_timeout) for r in replicas))
        self.judge_all()
        if self.on_load is not None:
            self.on_load()

    async def discover(self) -> None:
        """Look up every DNS entry once; add the addresses that appeared, remove those that vanished."""
        dynamic = [t for t in self.targets if t.dynamic]
        results = await asyncio.gather(
            *(self.resolver(t.host, t.port) for t in dynamic), return_exceptions=True
        )
        added: list[Replica] = []
        for target, found in zip(dynamic, results, strict=True):
            if isinstance(found, BaseException):
                if not isinstance(found, OSError):
                    raise found
                log.warning(
                    "%s: cannot look up %s (%s); keeping its replicas", target.stage, target.entry, found
                )
                continue
            added += self._apply(target, found)
        if added:
            await asyncio.gather(*(health.check(r, self.info_timeout) for r in added))
            self.judge_all()

    def _apply(self, target: Target, found: list[str]) -> list[Replica]:
        replicas = self.sets[target.stage].replicas
        known = {r.address for r in replicas}
        mine = {r.address for r in replicas if r.source == target.entry}
        wanted = set(found)
        added = []
        for address in sorted(wanted - known):
            log.info("%s replica %s found through %s", target.stage, address, target.entry)
            added.append(self.add(target.stage, address, source=target.entry, server_name=target.host))
        for address in sorted(mine - wanted):
            log.info("%s replica %s no longer in %s: removed", target.stage, address, target.entry)
            self.remove(target.stage, address)
        return added

    async def _watch(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self.check_interval)

    async def _rediscover(self) -> None:
        while True:
            await asyncio.sleep(self.discovery_interval)
            try:
                await self.discover()
            except Exception:
                log.exception("replica discovery failed; retrying in %.1fs", self.discovery_interval)

    async def start(self) -> None:
        await self.discover()
        await self.check_all()
        self._task = asyncio.create_task(self._watch())
        if any(t.dynamic for t in self.targets):
            self._discovery = asyncio.create_task(self._rediscover())

    async def stop(self) -> None:
        for task in (self._task, self._discovery, *self._releasing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for s in self.sets.values():
            for r in s.replicas:
                await r.channel.close()

    def snapshot(self) -> dict[str, list[dict[str, object]]]:
        return {
            stage: [
                {
                    "address": r.address,
                    "healthy": r.healthy,
                    "in_rotation": r.in_rotation,
                    "refused": r.refused,
                    "inflight": r.inflight,
                    "served": r.served,
                }
                for r in s.replicas
            ]
            for stage, s in self.sets.items()
        }
