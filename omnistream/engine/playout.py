"""How much audio a request's listener has buffered, as one stage sees it: the talker's and
Code2Wav's schedulers serve the stream closest to running dry first (earliest deadline first).

A stage cannot see the listener, but it knows what it has emitted itself: once its first audio
(talker: a codec frame, Code2Wav: samples) left at `first_output`, a listener that started playing
then runs dry at `first_output + seconds emitted so far`. Before any audio the deadline is the
request's arrival plus a time-to-first-audio target. `deadline - now` is the audio still buffered
(negative: the listener is already waiting). Only the order of deadlines matters to the
scheduler, so the stage's own emission times stand in for the listener's (each stage is upstream
of the listener by a roughly constant delay).

Torch-free and clock-free (callers pass `time.monotonic()` readings), so the arithmetic is unit
tested on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

# Before its first audio a request counts as holding this much: it yields to requests that hold
# less (they run dry sooner) and goes ahead of those that hold more.
DEFAULT_FIRST_AUDIO_TARGET_S = 0.5


@dataclass
class Playout:
    """One request's audio clock at one stage."""

    arrived: float  # monotonic seconds: when the stage admitted the request
    first_audio_target: float = DEFAULT_FIRST_AUDIO_TARGET_S
    first_output: float | None = None  # when the stage emitted its first audio
    seconds_out: float = 0.0  # audio seconds emitted so far

    def deadline(self) -> float:
        """When the listener runs dry (before the first audio: when it is due)."""
        if self.first_output is None:
            return self.arrived + self.first_audio_target
        return self.first_output + self.seconds_out

    def buffered(self, now: float) -> float:
        """Audio seconds the listener still holds at `now` (before the first audio: the time left
        to the first-audio target); negative once it is late."""
        return self.deadline() - now

    def emitted(self, seconds: float, now: float) -> None:
        """Record `seconds` of audio leaving the stage at `now` (the first call starts the clock)."""
        if self.first_output is None:
            self.first_output = now
        self.seconds_out += seconds


class Scheduled(Protocol):
    """What `by_deadline` orders: an engine request state with a playout clock."""

    arrived: float
    playout: Playout


S = TypeVar("S", bound=Scheduled)


def by_deadline(states: Iterable[S]) -> list[S]:
    """`states` most urgent first: earliest deadline, ties by arrival, then by the given order
    (the sort is stable, and the engine hands its requests over in arrival order)."""
    return sorted(states, key=lambda s: (s.playout.deadline(), s.arrived))


def check_step_budget(name: str, value: int | None) -> None:
    """A per-step budget is a positive count, or None (no budget of its own)."""
    if value is not None and value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


def buffered_seconds(states: Sequence[Scheduled], now: float) -> tuple[float, ...]:
    """The buffered audio of the requests a step runs, for the stage's metrics."""
    return tuple(s.playout.buffered(now) for s in states)
