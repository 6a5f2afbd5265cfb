"""Admission: a bound on concurrent streams plus an optional bounded, timed wait queue.

The permit lives as long as the stream (released when the response ends, however it ends), so the
bound counts what really occupies the stages, not how fast requests arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from omnistream.errors import Overloaded


class Rejected(Overloaded):
    """Overloaded, with the reason (for metrics) and a hint for Retry-After."""

    def __init__(self, message: str, reason: str, retry_after: int) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class Admission:
    def __init__(
        self, max_concurrency: int, max_queue: int = 0, queue_timeout: float = 10.0, retry_after: int = 1
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self.retry_after = retry_after
        self.active = 0
        self._waiters: deque[asyncio.Future] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> Permit:
        if self.active < self.max_concurrency and not self._waiters:
            self.active += 1
            return Permit(self)
        if len(self._waiters) >= self.max_queue:
            raise Rejected(
                f"server is at its limit of {self.max_concurrency} concurrent requests"
                + (f" and {self.max_queue} queued" if self.max_queue else ""),
                reason="concurrency" if not self.max_queue else "queue_full",
                retry_after=self.retry_after,
            )
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.queue_timeout)
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():
                return Permit(self)  # granted just as the timer fired
            waiter.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            raise Rejected(
                f"no capacity within {self.queue_timeout:g}s",
                reason="queue_timeout",
                retry_after=self.retry_after,
            ) from None
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()  # granted but the caller went away
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise
        return Permit(self)

    async def acquire_now(self) -> Permit:
        """Re-take the slot a failed attempt of the same request just released (retries skip the queue)."""
        self.active += 1
        return Permit(self)

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # hand the slot over: `active` stays the same
                return
        self.active -= 1


class Permit:
    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._release()
