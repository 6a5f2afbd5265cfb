"""Run producer coroutines in the background and hand their items to one async-iterating consumer.

Both the in-process pipeline and the gateway's stage wiring are "several pumps, one output stream":
this keeps the hand-off, the error propagation and the cancellation in one place. When the consumer
stops early, the producers are cancelled; a cancelled producer never blocks on a full queue.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")
Emit = Callable[[Any], Awaitable[None]]

_END = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


async def relay(body: Callable[[Emit], Awaitable[None]], maxsize: int = 256) -> AsyncIterator[Any]:
    """Yield what `body(emit)` emits, in order; re-raise its error; cancel it if the consumer leaves."""
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize)

    async def run() -> None:
        try:
            await body(queue.put)
        except asyncio.CancelledError:
            raise  # the consumer is gone: nobody is waiting for an item
        except BaseException as exc:
            await queue.put(_Failure(exc))
            raise
        await queue.put(_END)

    task = asyncio.create_task(run())
    try:
        while (item := await queue.get()) is not _END:
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
