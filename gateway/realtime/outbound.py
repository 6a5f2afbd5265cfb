"""The one writer of a realtime socket: a bounded queue of server events and the loop that sends them.

Bounded, so a client that stops reading stalls its own response (the response waits for room, the
stages feel backpressure) instead of growing the gateway's memory. Deltas are tagged with their
response, so a barge-in can drop the ones not yet sent (`purge`): what the client already got is
exactly what was handed to the socket, which is what the assistant item is truncated to.
A send that does not complete within `send_timeout` (the client stopped reading and the socket's
buffers are full) ends the session, so such a client cannot hold a response's stage slots forever.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol


class DeltaOwner(Protocol):
    """The response a delta belongs to, told when its audio really leaves."""

    id: str

    def sent(self, samples: int) -> None: ...


# How long one event may take to leave: far above any live client's stall, far below "forever".
SEND_TIMEOUT_S = 30.0


class Outbound:
    def __init__(
        self,
        send: Callable[[str], Awaitable[None]],
        capacity: int = 256,
        send_timeout: float = SEND_TIMEOUT_S,
    ) -> None:
        self._send = send
        self.capacity = capacity
        self.send_timeout = send_timeout
        self._items: deque[tuple[dict[str, Any], DeltaOwner | None, int]] = deque()
        self._changed = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.closed = False

    async def put(
        self, event: dict[str, Any] | None, owner: DeltaOwner | None = None, samples: int = 0
    ) -> None:
        """Queue `event` (None: nothing, a beta-less event); waits while the queue is full. A delta
        gives its response as `owner` (and its audio samples); after `close` this does nothing."""
        if event is None:
            return
        while len(self._items) >= self.capacity and not self.closed:
            self._room.clear()
            await self._room.wait()
        if self.closed:
            return
        self._items.append((event, owner, samples))
        self._changed.set()

    def purge(self, owner: DeltaOwner) -> int:
        """Drop `owner`'s deltas not sent yet; returns how many went."""
        before = len(self._items)
        self._items = deque(item for item in self._items if item[1] is not owner)
        self._room.set()
        return before - len(self._items)

    def close(self) -> None:
        self.closed = True
        self._items.clear()
        self._changed.set()
        self._room.set()

    async def run(self) -> None:
        """Send until closed; raises when the socket fails or a send outlasts `send_timeout` (the
        session's serve loop then ends the session: its responses and their stage streams)."""
        while not self.closed:
            while not self._items and not self.closed:
                self._changed.clear()
                await self._changed.wait()
            if self.closed:
                return
            event, owner, samples = self._items.popleft()
            self._room.set()
            if owner is not None and samples:
                owner.sent(samples)
            await asyncio.wait_for(self._send(json.dumps(event, ensure_ascii=False)), self.send_timeout)

    async def drain(self, timeout: float) -> None:
        """Wait (at most `timeout`) until everything queued was sent: before a deliberate close."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._items and not self.closed and loop.time() < deadline:
            await asyncio.sleep(0.01)
