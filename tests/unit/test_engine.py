"""The engine's output channel: bounded, ordered, and never waking the engine under its own lock."""

from __future__ import annotations

import asyncio

import pytest

from omnistream.engine import OutputStream


def test_consumer_wakes_the_engine_without_holding_the_stream_lock():
    # The engine thread holds its condition and then asks `has_room()` (the stream lock); the
    # consumer must therefore call back into the engine only after releasing the stream lock,
    # or the two threads deadlock (seen as a request stuck until its timeout).
    async def run() -> list[bool]:
        free: list[bool] = []
        stream: OutputStream[int] = OutputStream(
            asyncio.get_running_loop(),
            8,
            on_consume=lambda: free.append(
                stream._lock.acquire(blocking=False) and (stream._lock.release() or True)
            ),
        )
        for i in range(3):
            stream.put(i)
        assert await stream.get() == 0
        assert await stream.get_batch() == [1, 2]
        return free

    free = asyncio.run(run())
    assert free and all(free)


def test_items_then_close_then_none_and_errors_surface():
    async def run():
        stream: OutputStream[int] = OutputStream(asyncio.get_running_loop(), 2)
        stream.put(1)
        assert stream.has_room()  # capacity 2, one item: room left
        stream.put(2)
        assert not stream.has_room()
        stream.close()
        assert [x async for x in stream] == [1, 2]
        failing: OutputStream[int] = OutputStream(asyncio.get_running_loop(), 2)
        failing.fail(RuntimeError("boom"))
        with pytest.raises(RuntimeError, match="boom"):
            await failing.get()
        closed: OutputStream[int] = OutputStream(asyncio.get_running_loop(), 2)
        closed.close()
        closed.fail(RuntimeError("late"))  # a finished request ignores late failures
        assert await closed.get() is None

    asyncio.run(run())
