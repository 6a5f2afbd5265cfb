"""One audio stream's start guard: fragile while its first chunk is short, until it has audio in hand.

The rule that holds new starts beside fragile streams is the admission's (`Permit.mark_starting`,
`settle`, gateway/admission/permits.py); this is the per-stream half, driven by the session from
what it hands the client: the stream turns fragile when it starts with less than `guard_s`
seconds in its first chunk, and settles once the listener has that much in hand, or after
`START_GUARD_TIMEOUT_S` whatever it has (a stream that never gets ahead, with no audio or slower
than real time, holds no one for long).

While it is fragile its need (the headroom it must be left) falls with the audio it has in hand:
each audio chunk recomputes it from where the stream is (`need_from`: windows delivered, seconds in
hand), and a lower need lets held requests in at once (`Permit.lower_need`) instead of after the
whole guard. Without that, a wave's first streams, sized nearly alone with 2-4 frame first chunks,
kept the rest of the wave waiting for a full second of audio each (docs/benchmarks.md, issue 33).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.admission.permits import Permit

# (windows delivered, seconds in hand) -> the headroom the stream needs from here (None: unknown)
NeedFrom = Callable[[int, float], float | None]

START_GUARD_TIMEOUT_S = 3.0  # the longest a fragile stream holds new audio starts


class StartGuard:
    """Marks `permit` fragile at once when `first_chunk_s` (None: no audio) is under `guard_s`."""

    def __init__(
        self, permit: Permit, first_chunk_s: float | None, guard_s: float, need_from: NeedFrom | None = None
    ) -> None:
        self._permit = permit
        self._guard_s = guard_s
        self._need_from = need_from
        self._timer: asyncio.TimerHandle | None = None
        if first_chunk_s is not None and first_chunk_s < guard_s and permit.audio:
            permit.mark_starting()
            self._timer = asyncio.get_running_loop().call_later(START_GUARD_TIMEOUT_S, permit.settle)

    def on_audio(self, in_hand: Callable[[], float], delivered: int = 0) -> None:
        """Audio went to the client (`delivered` windows so far): settle once `in_hand()` (seconds
        received, not yet played) has reached the guard, else lower the need to what the stream
        needs from here. `in_hand` is called only while the stream is still fragile."""
        if self._timer is None or not self._permit.starting:
            return
        held = in_hand()
        if held >= self._guard_s:
            self._permit.settle()
        elif self._need_from is not None and held > 0 and delivered > 0:
            need = self._need_from(delivered, held)
            if need is not None:
                self._permit.lower_need(need)

    def cancel(self) -> None:
        """The session ended: no timer left behind (the permit's release settles it)."""
        if self._timer is not None:
            self._timer.cancel()
