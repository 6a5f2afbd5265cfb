"""One connection's uncommitted input audio: the buffer (bounded, its samples placed on the
stream the VAD counts), when its audio arrived, and the rate appends may fill it at.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

# Appends that arrive within this of the first of them share one arrival (the last one's): a client
# of tiny appends cannot use up the record, and an end of speech is placed 10 ms late at most.
ARRIVAL_RESOLUTION_S = 0.01
# Arrivals remembered (the oldest are forgotten first): at least 20 s of appends, 40 s of a
# microphone's 20 ms ones, more than a turn's end (at most a 10 s silence window before the
# buffer's end) needs.
MAX_ARRIVALS = 2048


class AppendRate:
    """A token bucket in seconds of audio: appends may run ahead of real time by `burst` seconds at
    most (so a client replaying a file is refused rather than flooding the VAD and the buffer)."""

    def __init__(self, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._at = clock()

    def take(self, seconds: float) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at))
        self._at = now
        if seconds > self._tokens:
            return False
        self._tokens -= seconds
        return True


class InputBuffer:
    """Uncommitted input audio (pcm16 24 kHz), at most `max_bytes`; `start` is the stream sample
    its first byte is (the VAD's positions are stream samples).

    It also keeps when its audio arrived: (end sample, time) of its latest appends, meaning "by this
    time the audio up to this sample had arrived", so `arrived_at` places an end of speech in time.
    Bounded twice: only the uncommitted audio's appends, and at most `max_arrivals` of them."""

    def __init__(self, max_bytes: int, max_arrivals: int = MAX_ARRIVALS) -> None:
        self.max_bytes = max_bytes
        self.data = bytearray()
        self.start = 0
        self.max_arrivals = max_arrivals
        self._arrivals: deque[tuple[int, float]] = deque()
        self._opened = 0.0  # when the first append the latest arrival covers came
        self._known_from = 0  # arrivals are known for the audio after this sample

    @property
    def end(self) -> int:
        return self.start + len(self.data) // 2

    def append(self, pcm: bytes, at: float | None = None) -> bool:
        """Add `pcm`, which arrived at `at` (time.monotonic(); now when None)."""
        if len(self.data) + len(pcm) > self.max_bytes:
            return False
        self.data += pcm
        if pcm:
            self._arrived(time.monotonic() if at is None else at)
        return True

    def _arrived(self, at: float) -> None:
        arrivals = self._arrivals
        if arrivals and at - self._opened < ARRIVAL_RESOLUTION_S:
            arrivals.pop()  # still true of the audio it covered: it had arrived by `at` as well
        else:
            self._opened = at
            if len(arrivals) >= self.max_arrivals:
                self._known_from = arrivals.popleft()[0]
        arrivals.append((self.end, at))

    def arrived_at(self, sample: int) -> float | None:
        """When the buffer's audio up to stream sample `sample` had all arrived: the arrival of the
        append that held the sample just before it. None where that is not known: not in the
        buffer (committed, cleared, not arrived yet) or among the appends forgotten."""
        if sample <= self._known_from or sample > self.end:
            return None
        found = None
        for end, at in reversed(self._arrivals):
            if end < sample:
                break
            found = at
        return found

    def _forget(self) -> None:
        """The arrivals of audio no longer in the buffer go."""
        while self._arrivals and self._arrivals[0][0] <= self.start:
            self._arrivals.popleft()
        self._known_from = max(self._known_from, self.start)

    def keep_from(self, sample: int) -> None:
        """Drop audio before `sample` (what a turn that has not started needs no more)."""
        cut = min(max(0, sample - self.start), len(self.data) // 2)
        if cut:
            del self.data[: cut * 2]
            self.start += cut
            self._forget()

    def _cut(self, until: int | None) -> int:
        """Bytes of the buffer's audio before stream sample `until` (all when None)."""
        return len(self.data) if until is None else min(len(self.data), max(0, until - self.start) * 2)

    def peek(self, until: int) -> bytes:
        """The audio `take(until)` would give, left in the buffer."""
        return bytes(self.data[: self._cut(until)])

    def take(self, until: int | None = None) -> bytes:
        """The buffer's audio up to stream sample `until` (all when None); the rest stays."""
        cut = self._cut(until)
        out = bytes(self.data[:cut])
        del self.data[:cut]
        self.start += cut // 2
        self._forget()
        return out

    def clear(self) -> None:
        self.start = self.end
        self.data.clear()
        self._forget()
