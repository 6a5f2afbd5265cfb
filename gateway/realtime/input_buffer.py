"""One connection's uncommitted input audio: the buffer (bounded, its samples placed on the
stream the VAD counts) and the rate appends may fill it at.
"""

from __future__ import annotations

import time
from collections.abc import Callable


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
    its first byte is (the VAD's positions are stream samples)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.data = bytearray()
        self.start = 0

    @property
    def end(self) -> int:
        return self.start + len(self.data) // 2

    def append(self, pcm: bytes) -> bool:
        if len(self.data) + len(pcm) > self.max_bytes:
            return False
        self.data += pcm
        return True

    def keep_from(self, sample: int) -> None:
        """Drop audio before `sample` (what a turn that has not started needs no more)."""
        cut = min(max(0, sample - self.start), len(self.data) // 2)
        if cut:
            del self.data[: cut * 2]
            self.start += cut

    def take(self, until: int | None = None) -> bytes:
        """The buffer's audio up to stream sample `until` (all when None); the rest stays."""
        cut = len(self.data) if until is None else min(len(self.data), max(0, until - self.start) * 2)
        out = bytes(self.data[:cut])
        del self.data[:cut]
        self.start += cut // 2
        return out

    def clear(self) -> None:
        self.start = self.end
        self.data.clear()
