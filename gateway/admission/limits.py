"""How many requests admission lets run at once and wait: what the stages say they hold, unless
the operator set a cap.

Every stage replica reports in its Info the requests it holds at once, running and waiting
(`StageLimits.max_requests`, 4x `--max-batch` by default); one more gets RESOURCE_EXHAUSTED. Every
request runs on a thinker, one with audio also on a talker and a code2wav, and a request goes to the
least-loaded replica in rotation of each stage. So by default (`Limits.of`):

* concurrency: the thinkers' room, the sum of max_requests over the thinker replicas in rotation:
  what the gateway admits, the thinkers take. Text-only requests are bounded by this alone.
* audio: requests with audio at once, also at most the audio stages' room (the smaller of the
  talkers' and the code2wavs' sums); past it an audio request waits in the audio hold's FIFO. The
  hold then decides by speed, as before (audio_capacity.py).
* queue, and the audio hold's queue: as many as may run (a burst of twice the room waits for the
  first half instead of being refused), at least QUEUE_FLOOR: while the stages report little or
  no room (a thinker leaving the rotation between a request's readiness check and its admission),
  requests wait for a replica, within `queue_timeout`, rather than get 429 at once.

The limits follow the replicas: they are read at every admission, and each health round lets in
what waits for the room it brings (`Admission.reconsider`). A replica whose Info reports no
max_requests (a stage older than the field) counts as UNREPORTED_ROOM, the cap every gateway had.

An operator's cap wins: `max_concurrency` bounds every request, audio ones included, whatever the
stages report (as before these defaults); `max_queue` and `audio_hold_queue` bound their queues.
Under a cap the queues default to the cap, without the floor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotated: the config imports admission, not the replicas
    from gateway.cluster.replica import Replica, ReplicaSet

QUEUE_FLOOR = 16  # requests that may wait by default, however little room the stages report
UNREPORTED_ROOM = 16  # requests a replica that reports no max_requests is taken to hold


@dataclass(frozen=True)
class Room:
    """Requests the stages' replicas in rotation hold at once: any request (the thinkers), and
    requests with audio (the tighter of the talkers and the code2wavs)."""

    requests: int = 0
    audio: int = 0


def replica_room(replica: Replica) -> int:
    """Requests one replica holds at once, as its Info says (0 while out of rotation)."""
    if not replica.in_rotation or replica.info is None:
        return 0
    return replica.info.limits.max_requests or UNREPORTED_ROOM


def stage_room(replicas: Iterable[Replica]) -> int:
    return sum(replica_room(r) for r in replicas)


def room_of(sets: Mapping[str, ReplicaSet]) -> Room:
    """The room of a deployment's replica sets (by stage name) as they stand now."""
    audio = min(stage_room(sets[stage].replicas) for stage in ("talker", "code2wav"))
    return Room(stage_room(sets["thinker"].replicas), audio)


@dataclass(frozen=True)
class Limits:
    """Admission's limits at one moment (module docstring)."""

    concurrency: int  # requests admitted at once
    queue: int  # requests that may wait for one of those slots
    audio_hold: int  # requests with audio that may wait in the audio hold
    audio: int | None = None  # of the admitted, those with audio at once (None: no bound of its own)

    @classmethod
    def of(
        cls,
        room: Room | None,
        max_concurrency: int | None = None,
        max_queue: int | None = None,
        max_audio_hold: int | None = None,
    ) -> Limits:
        """The operator's caps where given (None: derived), the rest from `room` (None: nothing
        known yet, no room)."""
        if max_concurrency is not None:
            concurrency, audio, wait = max_concurrency, None, max_concurrency
        else:
            room = room or Room()
            concurrency, audio = room.requests, min(room.requests, room.audio)
            wait = max(concurrency, QUEUE_FLOOR)
        return cls(
            concurrency,
            wait if max_queue is None else max_queue,
            wait if max_audio_hold is None else max_audio_hold,
            audio,
        )

    @property
    def with_audio(self) -> int:
        """Requests with audio admitted at once at most: their own bound, else every request's."""
        return self.concurrency if self.audio is None else self.audio
