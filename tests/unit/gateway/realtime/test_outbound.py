"""The send queue: bounded, and a barge-in drops the deltas not sent yet."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.realtime.outbound import Outbound


class Owner:
    id = "resp"

    def __init__(self) -> None:
        self.samples = 0

    def sent(self, samples: int) -> None:
        self.samples += samples


def test_purge_drops_only_that_responses_unsent_deltas_and_counts_what_left():
    async def run():
        sent: list[str] = []
        gate = asyncio.Event()

        async def send(text: str) -> None:
            sent.append(text)
            await gate.wait()

        out = Outbound(send, capacity=8)
        owner, other = Owner(), Owner()
        await out.put({"n": 1}, owner, 10)
        sender = asyncio.create_task(out.run())
        await asyncio.sleep(0)  # the first delta is handed to the socket
        await out.put({"n": 2}, owner, 10)
        await out.put({"n": 3}, other, 5)
        await out.put({"n": 4})
        assert out.purge(owner) == 1
        gate.set()
        while len(sent) < 3:
            await asyncio.sleep(0)
        out.close()
        await sender
        assert [json.loads(text)["n"] for text in sent] == [1, 3, 4]
        assert (owner.samples, other.samples) == (10, 5)

    asyncio.run(run())


def test_a_full_queue_makes_the_producer_wait_and_close_releases_it():
    async def run():
        out = Outbound(lambda text: asyncio.sleep(0), capacity=2)
        await out.put({"a": 1})
        await out.put({"a": 2})
        blocked = asyncio.create_task(out.put({"a": 3}))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        out.close()
        await asyncio.wait_for(blocked, 1)

    asyncio.run(run())


def test_a_send_that_never_completes_ends_the_run():
    """A client that stopped reading: the send blocks; the run gives up after `send_timeout`, so the
    session ends and its responses free their stages."""

    async def run() -> None:
        async def stuck(_: str) -> None:
            await asyncio.sleep(3600)

        out = Outbound(stuck, send_timeout=0.05)
        await out.put({"type": "response.output_audio.delta"})
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(out.run(), 10)

    asyncio.run(run())
