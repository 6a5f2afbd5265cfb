"""One stage replica as the gateway sees it (health, Info, load, requests in flight), and a stage's
set of them with its choice of replica: the least loaded one in rotation that takes the request's
media. `gateway.cluster.health` keeps the state current; `gateway.cluster.replicas` owns the sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc  # type: ignore[import-untyped]  # grpcio-health-checking ships no stubs

from gateway.cluster.deployment import StageInfo
from omnistream.proto.omni.v1 import stage_pb2
from omnistream.request.errors import Unavailable


@dataclass
class Replica:
    stage: str
    address: str
    channel: grpc.aio.Channel
    stub: Any  # the stage's generated stub (replicas.STUBS): grpc's *_pb2_grpc.py are untyped
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
