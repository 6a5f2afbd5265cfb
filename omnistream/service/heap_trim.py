"""Hand the heap memory that glibc keeps after a burst of large frees back to the OS.

Code2Wav's activations are large (tens of MB per batched window) and change size with every window
and batch. glibc's malloc raises its mmap threshold to the largest block freed so far (up to 32 MB),
so after the first few steps those blocks come from the arenas' heaps, and freed heap memory goes
back to the OS only from the top of a heap and only past a threshold that rose with it. The result
is RSS that climbs by a few hundred MB over the first few hundred requests and then stays there,
although that memory is free (docs/benchmarks.md, "Memory: code2wav RSS over 1,000 requests").
`malloc_trim(0)` returns every free page of every arena.

`HeapTrimmer` is an engine step listener (it runs on the engine thread, between steps, so it never
contends with a forward for the arena locks): it trims after a step that leaves the engine without
requests (at most once a second), and, for a service that never goes idle, every `interval`
seconds. A trim takes 1-400 ms (it returns up to a few hundred MB), and the next step refaults the
pages it touches, so it is kept off the busy path: while requests run, the allocator reuses what it
holds and RSS stays at its plateau anyway. `OMNISTREAM_MALLOC_TRIM_S` sets the interval; 0 turns
trimming off. Without glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omnistream.engine.api import StageEngine

log = logging.getLogger(__name__)

INTERVAL_ENV = "OMNISTREAM_MALLOC_TRIM_S"
DEFAULT_INTERVAL_S = 60.0  # never idle: one trim a minute (<1% of the engine's time even at 400 ms)
MIN_IDLE_GAP_S = 1.0  # idle trims: at most one a second (one request at a time would trim per request)


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim  # the C library this process already uses
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


class HeapTrimmer:
    """`engine.add_step_listener(HeapTrimmer())`: malloc_trim(0) on the engine thread (see above)."""

    def __init__(self, interval: float | None = None) -> None:
        if interval is None:
            try:
                interval = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
            except ValueError:
                log.warning("%s is not a number: using %s s", INTERVAL_ENV, DEFAULT_INTERVAL_S)
                interval = DEFAULT_INTERVAL_S
        self.interval = interval
        self._trim = _malloc_trim() if interval > 0 else None
        self._last = time.monotonic()
        self.trims = 0
        self.seconds = 0.0  # spent in malloc_trim so far

    @property
    def enabled(self) -> bool:
        return self._trim is not None

    def __call__(self, engine: StageEngine, step_seconds: float) -> None:
        if self._trim is None:
            return
        since = time.monotonic() - self._last
        if since < self.interval and not (since >= MIN_IDLE_GAP_S and engine.num_requests == 0):
            return
        started = time.monotonic()
        self._trim(0)
        self._last = time.monotonic()
        self.trims += 1
        self.seconds += self._last - started
