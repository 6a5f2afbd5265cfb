"""Audio admission by measured speed: protect the listeners already playing.

Every listener consumes `frame_rate` codec frames a second (12.5 for Qwen3-Omni). The talker and
code2wav report what they sustain (`StageInfo.load.capacity_per_second`: frames per second of engine
busy time at their current batch, omnistream/speed.py), summed here over a stage's replicas in
rotation. The tighter of the two is the deployment's audio capacity C.

How C changes with the batch is not measured (only the current batch is): a batched step costs
more than a single one, usually much less than proportionally. The estimate assumes the worst
case that still makes sense, that a step's time grows in proportion to its batch, i.e. that C stays
what it was measured at: one more stream gets no faster hardware, only a share of it. So with S
audio streams running, the new one would get C / (S + 1) frames a second, and

    headroom(S + 1) = C / ((S + 1) x frame_rate)

is how many times faster than real time each stream would be produced. The rules:

* admit: one more stream starts when `headroom(S + 1) >= 1 + margin`, or when no audio stream runs
  (one stream cannot make another stutter, and it is what refreshes a stale measure), or when C is
  unknown (old stages, nothing measured yet): today's behaviour. Otherwise the request waits in the
  audio hold queue (gateway/admission.py) until a stream ends or a new measure allows it.
* first chunk: while the listener plays the first `initial` frames (initial / frame_rate seconds)
  the next `chunk` frames must be produced (chunk / (headroom x frame_rate) seconds), so
  `initial >= chunk / headroom`; the smallest of the load rule's sizes (2, 4, 8, 16 for 25-frame
  chunks) that satisfies it, the largest when none does.

Torch-free and pure: the numbers come from the replicas (`measured_capacity`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.replicas import Replica

DEFAULT_FRAME_RATE = 12.5  # Qwen3-Omni's codec frames per second, when no stage said
DEFAULT_MARGIN = 0.2  # hold while each stream would be produced less than 1.2x faster than real time
AUDIO_STAGES = ("talker", "code2wav")


def measured_capacity(replicas: Iterable[Replica]) -> float | None:
    """Units per busy second of a stage: the sum over its replicas in rotation; None when any of
    them has no measure (an old stage, a failed read, nothing run since warm-up) or none is in
    rotation: a partial sum would understate the stage and hold requests it could serve."""
    total = 0.0
    usable = [r for r in replicas if r.in_rotation]
    for replica in usable:
        load = replica.load
        if load is None or load.measured_steps == 0 or load.capacity_per_second <= 0:
            return None
        total += load.capacity_per_second
    return total if usable else None


@dataclass(frozen=True)
class AudioCapacity:
    """The deployment's audio capacity in codec frames per second (None: unknown)."""

    frames_per_second: float | None
    frame_rate: float = DEFAULT_FRAME_RATE

    @classmethod
    def of(cls, capacities: Iterable[float | None], frame_rate: float | None) -> AudioCapacity:
        """The tightest of the audio stages' known capacities (unknown when none is known)."""
        known = [c for c in capacities if c is not None]
        return cls(min(known) if known else None, frame_rate or DEFAULT_FRAME_RATE)

    def headroom(self, streams: int) -> float | None:
        """How many times faster than real time each of `streams` would be produced; None unknown."""
        if self.frames_per_second is None:
            return None
        if streams <= 0:
            return math.inf
        return self.frames_per_second / (streams * self.frame_rate)

    def admits(self, running: int, margin: float = DEFAULT_MARGIN) -> bool:
        """May one more audio stream start beside `running` ones?"""
        headroom = self.headroom(running + 1)
        return running == 0 or headroom is None or headroom >= 1.0 + margin


def chunk_sizes(chunk: int) -> list[int]:
    """The first-chunk sizes of `dynamic_initial_frames`: 2, 4, ... up to the largest power of two
    below `chunk` (just [1] for a chunk too small for any)."""
    sizes = []
    size = 2
    while size < chunk:
        sizes.append(size)
        size *= 2
    return sizes or [1]


def initial_frames_for(headroom: float, chunk: int) -> int:
    """The smallest first chunk under which the second one is ready when the first has played:
    `initial >= chunk / headroom` (module docstring)."""
    sizes = chunk_sizes(chunk)
    need = chunk / headroom if headroom > 0 else math.inf
    return next((s for s in sizes if s >= need), sizes[-1])
