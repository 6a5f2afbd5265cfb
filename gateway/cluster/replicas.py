"""Replica choice: each request goes to the least-loaded healthy replica of each stage.

A replica leaves the rotation when its health check fails or a call to it fails with UNAVAILABLE,
and comes back as soon as its health check answers SERVING again. A check that only timed out is a
slow answer, not a failure, until `MISSED_CHECKS_TO_LEAVE` in a row have: on a loaded machine one
check can wait its whole timeout (a stage's health took 0.95 s beside a vLLM start on 2 cores), and
with one replica a stage, that one check would refuse every audio request until the next round.
A stage that says NOT_SERVING (draining) or cannot be reached leaves at once.

Replicas come from the configured entries of each stage (parsed and looked up in
gateway/cluster/discovery.py). An IP literal (`10.0.0.7:50051`, `[fd00::7]:50051`) or a `unix:` path is one
static replica. A DNS name (`talker:50051`, or explicitly
`dns:///talker.omnistream.svc:50051`) is looked up every `discovery_interval` seconds and every
address it resolves to is a replica: a Kubernetes headless Service (or a Compose service with several
replicas) answers with one address per ready pod, so scaling a stage needs no gateway restart.
Addresses that appear are added (and health-checked at once), addresses that vanish are removed
after their running requests finish; a failed look-up keeps the replicas known so far.

A replica joins the rotation only once the gateway has its Info and the deployment accepted it (see
`gateway.cluster.deployment`): the Info is read whenever a replica becomes healthy (first seen, or back
after a failure: it may be another process now), and a replica that cannot answer it stays out until
a later health round gets an answer.

Every later health round of a healthy replica reads its Info again for the one part that changes,
its measured speed (`StageInfo.load`, see omnistream/service/speed.py), which admission uses
(gateway/admission/audio_capacity.py); its identity is not judged again (the process is the same one as long
as its health never failed). A stage too old to report a load, or one whose Info fails in a round,
has no load until it reports one: its speed is unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.cluster.deployment import Deployment, StageInfo
from gateway.cluster.discovery import Resolver, Target, resolve_addresses
from omnistream.proto.omni.v1 import stage_pb2, stage_pb2_grpc
from omnistream.request.errors import Unavailable
from omnistream.service.security import open_channel
from omnistream.service.server import client_channel_options

log = logging.getLogger(__name__)

STUBS = {
    "thinker": stage_pb2_grpc.ThinkerServiceStub,
    "talker": stage_pb2_grpc.TalkerServiceStub,
    "code2wav": stage_pb2_grpc.Code2WavServiceStub,
}


INFO_TIMEOUT = 5.0  # seconds a replica has to answer Info before it stays out for this round
HEALTH_TIMEOUT = 2.0  # seconds a replica has to answer a health check
LOAD_TIMEOUT = HEALTH_TIMEOUT  # seconds for the per-round Info read of the load
MISSED_CHECKS_TO_LEAVE = 3  # health checks in a row that time out before a healthy replica leaves


def load_of(info: StageInfo) -> stage_pb2.StageLoad | None:
    """The load an Info carries; None from a stage that predates the field."""
    return info.load if info.HasField("load") else None


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
    source: str | None = None  # the DNS entry that found it; None for a static entry
    info: StageInfo | None = None  # its Info, read when it last became healthy
    accepted: bool = False  # the deployment accepted `info` (False until it was judged)
    refused: str | None = None  # why the deployment does not accept its info
    info_error: str | None = None  # why its Info could not be read, while that lasts
    load: stage_pb2.StageLoad | None = None  # its measured speed, from the last health round
    missed_checks: int = 0  # health checks in a row that timed out while it was healthy

    @property
    def in_rotation(self) -> bool:
        return self.healthy and self.accepted

    @property
    def input_modalities(self) -> frozenset[str]:
        """What its Info says it takes in a prompt (a thinker; empty for the other stages)."""
        return frozenset(self.info.input_modalities) if self.info is not None else frozenset()

    def takes(self, kinds: frozenset[str]) -> bool:
        """Does it take every one of `kinds` (media in a prompt)? An Info that names no modalities
        (an older stage) is taken to accept whatever the deployment does, as before."""
        return not kinds or not self.input_modalities or kinds <= self.input_modalities


@dataclass
class ReplicaSet:
    stage: str
    replicas: list[Replica] = field(default_factory=list)

    def pick(self, kinds: frozenset[str] = frozenset()) -> Replica:
        """The least-loaded replica in rotation that takes every one of `kinds` (the request's media:
        a deployment may mix thinkers that take media with text-only ones, e.g. vLLM's)."""
        rotation = [r for r in self.replicas if r.in_rotation]
        if not rotation:
            raise Unavailable(f"no healthy {self.stage} replica")
        usable = [r for r in rotation if r.takes(kinds)]
        if not usable:
            raise Unavailable(
                f"no healthy {self.stage} replica takes {' and '.join(sorted(kinds))} input now "
                f"(the {len(rotation)} in rotation take: {', '.join(self.input_modalities() or ())})"
            )
        return min(usable, key=lambda r: (r.inflight, r.served))

    def input_modalities(self) -> tuple[str, ...] | None:
        """What the replicas in rotation take between them, in Info order (None: none reported)."""
        seen: dict[str, None] = {}
        for replica in self.replicas:
            if replica.in_rotation and replica.info is not None:
                seen.update(dict.fromkeys(replica.info.input_modalities))
        return tuple(seen) or None

    def max_model_len(self) -> int | None:
        """The smallest max_model_len the replicas in rotation report (a request may go to any of
        them); None when none reports one."""
        lengths = [
            r.info.limits.max_model_len
            for r in self.replicas
            if r.in_rotation and r.info is not None and r.info.limits.max_model_len
        ]
        return min(lengths) if lengths else None

    @property
    def any_in_rotation(self) -> bool:
        return any(r.in_rotation for r in self.replicas)


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
        info_timeout: float = INFO_TIMEOUT,
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
        self._task: asyncio.Task | None = None
        self._discovery: asyncio.Task | None = None
        self._closing: set[asyncio.Task] = set()
        self._releasing: set[asyncio.Task] = set()  # cache scopes being released (release_cache_soon)
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

    async def check(self, replica: Replica) -> None:
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
            await self.read_info(replica)
        elif ok:
            await self.read_load(replica)
        else:
            replica.load = None
        if ok != replica.healthy:
            log.info(
                "%s replica %s is now %s", replica.stage, replica.address, "healthy" if ok else "unhealthy"
            )
        replica.healthy = ok

    async def read_info(self, replica: Replica) -> None:
        """Read the replica's Info; on failure it has none (out of rotation) until a later round."""
        replica.accepted = False  # until `judge` has seen what it says now
        try:
            info = await replica.stub.Info(stage_pb2.InfoRequest(), timeout=self.info_timeout)
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

    async def read_load(self, replica: Replica) -> None:
        """Refresh the replica's measured speed from a new Info; a failed read forgets it (unknown)
        and is not a health failure (the health check decides that)."""
        try:
            info = await replica.stub.Info(stage_pb2.InfoRequest(), timeout=LOAD_TIMEOUT)
        except (grpc.aio.AioRpcError, TimeoutError):
            replica.load = None
            return
        replica.load = load_of(info)

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
                await replica.stub.ReleaseCache(request, timeout=timeout)  # type: ignore[attr-defined]
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
        await asyncio.gather(*(self.check(r) for r in replicas))
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
            await asyncio.gather(*(self.check(r) for r in added))
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

    def snapshot(self) -> dict[str, list[dict]]:
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
