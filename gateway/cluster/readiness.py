"""Readiness per need: what kinds of request the gateway can serve with the replicas it has now.

A text answer needs a thinker only; a spoken one needs a thinker, a talker and a code2wav (the
stage chain, `omnistream.request.stage_chain.stages_for`). So a deployment of thinkers alone serves text
chat, and a talker outage stops speech but not text. Every request is checked against what it needs
(`require`, in `GatewayCore.open`), and refused with 503 naming the stage(s) it lacks; `/ready`
reports both kinds (`serves`, `missing`) and is 200 while anything can be served, 503 when nothing
can (no thinker): a load balancer should keep sending text to a gateway that can answer it, while
a client that needs audio reads `serves.audio`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omnistream.request.errors import Unavailable
from omnistream.request.stage_chain import CODE2WAV, TALKER, THINKER

NEEDS = {"text": (THINKER,), "audio": (THINKER, TALKER, CODE2WAV)}


@dataclass(frozen=True)
class Readiness:
    """The stages each kind of request lacks now (empty: that kind can be served)."""

    missing: dict[str, tuple[str, ...]]

    @classmethod
    def of(cls, in_rotation: Callable[[str], bool]) -> Readiness:
        """From whether each stage has a replica in rotation (healthy and accepted)."""
        down = {stage for stages in NEEDS.values() for stage in stages if not in_rotation(stage)}
        return cls({kind: tuple(s for s in stages if s in down) for kind, stages in NEEDS.items()})

    @property
    def serves(self) -> dict[str, bool]:
        return {kind: not lacking for kind, lacking in self.missing.items()}

    @property
    def ready(self) -> bool:
        """Something can be served (at least text)."""
        return any(self.serves.values())

    def require(self, audio: bool) -> None:
        """Raise 503 / UNAVAILABLE naming the stages a request (with audio or text only) lacks."""
        kind = "audio" if audio else "text"
        lacking = self.missing[kind]
        if lacking:
            names = " or ".join(lacking)
            raise Unavailable(f"no {names} replica is ready: {kind} requests cannot be served now")

    def body(self) -> dict[str, Any]:
        """`/ready`'s summary (next to the per-replica `stages`)."""
        return {
            "ready": self.ready,
            "serves": self.serves,
            "missing": {kind: list(lacking) for kind, lacking in self.missing.items() if lacking},
        }
