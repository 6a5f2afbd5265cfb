"""A replay to a sibling (omnistream/chain/resume.py): what was fed goes again once and in order,
input recorded while the replay runs joins it rather than going twice or ahead, and the end follows
the last input; a chain that cannot resume keeps nothing."""

from __future__ import annotations

import asyncio

from omnistream.chain.resume import Loss, Replay, replay_to
from omnistream.request.errors import Unavailable


class Sibling:
    """A link that takes a turn of the loop on every write (as a gRPC write may)."""

    def __init__(self) -> None:
        self.log: list[object] = []

    async def open(self) -> None:
        self.log.append("open")
        await asyncio.sleep(0)

    async def feed(self, item: object) -> None:
        await asyncio.sleep(0)
        self.log.append(item)

    async def end_input(self) -> None:
        self.log.append("end")

    def close(self) -> None:
        pass


async def test_input_recorded_during_a_replay_goes_once_in_order_then_the_end():
    replay: Replay[int] = Replay()
    for item in (1, 2, 3):
        assert replay.due(item)  # not replaying: the caller sends it to the current link too
    sibling = Sibling()

    async def more_input() -> None:
        for item in (4, 5):
            await asyncio.sleep(0)
            assert not replay.due(item)  # replaying: the replay sends it
        assert not replay.end()

    await asyncio.gather(replay_to(sibling, replay), more_input())
    assert sibling.log == ["open", 1, 2, 3, 4, 5, "end"]
    assert replay.due(6) and not replay.replaying  # after the replay: the caller sends again


async def test_the_gap_is_measured_once_from_the_first_loss_which_stays_the_answer():
    loss = Loss()
    assert loss.gap() is None
    first = Unavailable("talker: lost", stage="talker")
    assert loss.seen(first) is first
    await asyncio.sleep(0.01)
    assert loss.seen(Unavailable("talker: the sibling too", stage="talker")) is first
    gap = loss.gap()
    assert gap is not None and gap >= 0.01
    assert loss.gap() is None


def test_a_chain_without_a_resumer_keeps_nothing():
    replay: Replay[int] = Replay(keep=False)
    assert replay.due(1) and replay.fed == []
