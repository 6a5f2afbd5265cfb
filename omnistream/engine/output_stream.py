"""The channel from an engine's thread to the asyncio side: one bounded `OutputStream` per request.

Torch-free and apart from the engine so the servicers and the pipeline, which only read it, see
what they may rely on: `put`/`fail`/`close` from the engine thread, `get`/`get_batch` on the loop,
and a bound the engine checks (`has_room`) instead of blocking.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class OutputStream(Generic[T]):
    """Bounded channel from the engine thread to one asyncio consumer.

    The engine checks `has_room()` before producing for a request, so the bound holds without ever
    blocking the engine thread. Items end with exactly one terminal item or an error.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        capacity: int,
        on_consume: Callable[[], None] | None = None,
        on_first_put: Callable[[], None] | None = None,
    ) -> None:
        """`on_consume`: called on the loop when items are taken; `on_first_put`: on the producer's
        thread, after the first item is queued (the engine then lets the loop send it at once)."""
        self._loop = loop
        self._capacity = capacity
        self._items: deque[T] = deque()
        self._lock = threading.Lock()
        self._event = asyncio.Event()
        self._error: BaseException | None = None
        self._closed = False
        self._on_consume = on_consume
        self._on_first_put = on_first_put
        self._put_any = False

    def queued(self) -> list[T]:
        """The items put and not yet taken, oldest first (a snapshot; nothing is consumed)."""
        with self._lock:
            return list(self._items)

    def has_room(self) -> bool:
        with self._lock:
            return len(self._items) < self._capacity

    def _notify(self) -> None:
        with contextlib.suppress(RuntimeError):  # loop closed: nobody is listening any more
            self._loop.call_soon_threadsafe(self._event.set)

    def put(self, item: T) -> None:
        with self._lock:
            self._items.append(item)
            first, self._put_any = not self._put_any, True
        self._notify()
        if first and self._on_first_put is not None:
            self._on_first_put()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if self._closed:  # the request already ended normally: a late input problem is moot
                return
            self._error = error
        self._notify()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._notify()

    async def get(self) -> T | None:
        """Next item; None once closed and drained; raises the error the engine reported."""
        while True:
            with self._lock:
                taken = bool(self._items)
                if taken:
                    item = self._items.popleft()
                elif self._error is not None:
                    raise self._error
                elif self._closed:
                    return None
            if taken:
                # Outside our lock: the engine thread takes its own lock, then ours (has_room);
                # waking it while holding ours would invert that order and deadlock.
                if self._on_consume is not None:
                    self._on_consume()
                return item
            self._event.clear()
            with self._lock:
                if self._items or self._error is not None or self._closed:
                    continue
            await self._event.wait()

    async def get_batch(self) -> list[T]:
        """Wait for at least one item, then take everything already there (a producer that is
        ahead ships several steps in one message). Empty once closed and drained."""
        first = await self.get()
        if first is None:
            return []
        items = [first]
        with self._lock:
            while self._items:
                items.append(self._items.popleft())
        if self._on_consume is not None and len(items) > 1:
            self._on_consume()
        return items

    async def __aiter__(self) -> AsyncIterator[T]:
        while (item := await self.get()) is not None:
            yield item
