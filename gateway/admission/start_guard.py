"""One audio stream's start guard: fragile while its first chunk is short, until it has audio in hand.

The rule that holds new starts beside fragile streams is the admission's (`Permit.mark_starting`,
`settle`, gateway/admission/permits.py); this is the per-stream half, driven by the session from
what it hands the client: the stream turns fragile when it starts with less than `guard_s`
seconds in its first chunk, and settles once the listener has that much in hand, or after
`START_GUARD_TIMEOUT_S` whatever it has (a stream that never gets ahead, with no audio or slower
than real time, holds no one for long).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.admission.permits import Permit

START_GUARD_TIMEOUT_S = 3.0  # the longest a fragile stream holds new audio starts


class StartGuard:
    """Marks `permit` fragile at once when `first_chunk_s` (None: no audio) is under `guard_s`."""

    def __init__(self, permit: Permit, first_chunk_s: float | None, guard_s: float) -> None:
        self._permit = permit
        self._guard_s = guard_s
        self._timer: asyncio.TimerHandle | None = None
        if first_chunk_s is not None and first_chunk_s < guard_s and permit.audio:
            permit.mark_starting()
            self._timer = asyncio.get_running_loop().call_later(START_GUARD_TIMEOUT_S, permit.settle)

    def on_audio(self, in_hand: Callable[[], float]) -> None:
        """Audio went to the client: settle once `in_hand()` (seconds received, not yet played) has
        reached the guard. `in_hand` is called only while the stream is still fragile."""
        if self._timer is not None and self._permit.starting and in_hand() >= self._guard_s:
            self._permit.settle()

    def cancel(self) -> None:
        """The session ended: no timer left behind (the permit's release settles it)."""
        if self._timer is not None:
            self._timer.cancel()
