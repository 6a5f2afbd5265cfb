"""What a chain asks of whoever can move a stage of a running request to a sibling replica.

A thinker lost mid-answer is re-opened on a sibling with the answer so far, which it continues: its
prompt and that answer prefilled, its next draw the one the uninterrupted run would have made (a
sampled request's draws are keyed by its seed and the token's index, omnistream/engine/step_seeds.py).
A talker or Code2Wav lost mid-stream loses nothing the chain cannot give again: it kept what it fed
the stage (`Replay`), the sibling regenerates deterministically from the start (greedy, or seeded:
every sampled request carries its seed), and the chain forwards only what comes after what it
already passed on. The carrier (the gateway's replicas) decides whether there is a sibling and opens
the link to it; the chain decides what to replay and what to skip. The in-process pipeline has no
siblings and passes no `Resumer`: a failure ends the request as it always did.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from omnistream.chain.links import Code2WavLink, TalkerLink, ThinkerLink
from omnistream.request.errors import OmniError

T = TypeVar("T")


class Resumer(Protocol):
    async def thinker(self, error: OmniError, answer_ids: list[int]) -> ThinkerLink | None:
        """A thinker link on a sibling, not yet opened, that continues the answer after `answer_ids`
        (what went on already); None when the request cannot move: then `error` is its answer."""
        ...

    async def talker(self, error: OmniError, start_frame: int) -> TalkerLink | None:
        """A talker link on a sibling whose outputs begin at `start_frame` (what came before went on
        already), not yet opened; None when the request cannot move (not a lost replica, no sibling,
        no resume left): then `error` is its answer."""
        ...

    async def code2wav(self, error: OmniError) -> Code2WavLink | None:
        """The same for Code2Wav (its audio is skipped by the chain, which knows its samples)."""
        ...

    def heard(self, stage: str, gap_s: float) -> None:
        """The resumed request's next output (audio; text for a thinker) went out `gap_s` seconds
        after the loss was seen."""
        ...


@dataclass
class Replay(Generic[T]):
    """Everything fed to one stage of one request, in order, and whether its input ended: what a
    sibling is given to regenerate the lost replica's output. While a sibling is being given it,
    new input only joins the record (the replay sends it), so nothing goes twice or out of order."""

    keep: bool = True  # False: nothing can resume (no resumer), so nothing is kept
    fed: list[T] = field(default_factory=list)
    ended: bool = False
    replaying: bool = False

    def due(self, item: T) -> bool:
        """Record `item`; whether the caller should also send it to the current link now."""
        if self.keep:
            self.fed.append(item)
        return not self.replaying

    def end(self) -> bool:
        """Record the input's end; whether the caller should also end the current link's input."""
        self.ended = True
        return not self.replaying


@dataclass
class Loss:
    """One stage lost under the request, until its next output went out: the first error, which is
    the client's answer if the stage cannot move (a sibling refusing or lost meanwhile is not), and
    when it was seen, for the gap its listener heard."""

    error: OmniError | None = None
    at: float = 0.0  # the event loop's time

    def seen(self, error: OmniError) -> OmniError:
        """Note `error` (the first since the stage's last output counts); the first error."""
        if self.error is None:
            self.error, self.at = error, asyncio.get_running_loop().time()
        return self.error

    def gap(self) -> float | None:
        """Seconds since the loss, once (its next output); None when nothing was lost."""
        if self.error is None:
            return None
        self.error = None
        return asyncio.get_running_loop().time() - self.at


async def replay_to(link: TalkerLink | Code2WavLink, replay: Replay[Any]) -> None:
    """Open `link` and give it everything recorded, including what is recorded meanwhile (the
    chain's pumps only record while this runs), then its end if the input ended."""
    replay.replaying = True
    try:
        await link.open()
        sent = 0
        while sent < len(replay.fed):
            await link.feed(replay.fed[sent])
            sent += 1
        if replay.ended:
            await link.end_input()
    finally:
        replay.replaying = False
