"""The chain's hand-off rules (omnistream/chain/run.py) over scripted links: what reaches the client
and each stage, in what order, and how an end or a failure travels. The same runner drives the
gateway's gRPC links and the pipeline's engine links (tests/integration, tests/reference)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from omnistream.chain.run import ChainRun
from omnistream.request.errors import Unavailable
from omnistream.request.generation import AudioEvent, CodesEvent, TextEvent
from omnistream.request.stage_outputs import AudioOut, CodecOut, ThinkerOut


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)


class Thinker:
    def __init__(self, log: Log, pieces: list[ThinkerOut]) -> None:
        self.log, self.pieces, self.closed = log, pieces, False

    async def open(self) -> None:
        self.log("thinker open")

    async def outputs(self) -> AsyncIterator[ThinkerOut]:
        for piece in self.pieces:
            await asyncio.sleep(0)
            yield piece

    def close(self) -> None:
        self.closed = True


class Talker:
    """Answers one chunk of `frames` frames per fed piece; `finish_after` pieces end its output."""

    def __init__(self, log: Log, finish_after: int, accept: asyncio.Event | None = None, fail: bool = False):
        self.log, self.finish_after, self.accept, self.fail = log, finish_after, accept, fail
        self.fed: list[list[int]] = []
        self.ended = False
        self.closed = False
        self._queue: asyncio.Queue[CodecOut | None] = asyncio.Queue()

    async def open(self) -> None:
        if self.accept is not None:
            await self.accept.wait()
        self.log("talker accepted")

    async def feed(self, piece: ThinkerOut) -> None:
        self.fed.append(piece.spoken if piece.spoken is not None else piece.token_ids)
        n = len(self.fed)
        if self.fail:
            raise Unavailable("talker: connection to the stage lost", stage="talker")
        if n <= self.finish_after:
            codes = np.full((2, 1), n)
            await self._queue.put(CodecOut(n - 1, 1, n == self.finish_after, "", codes))
        if n == self.finish_after:
            await self._queue.put(None)

    async def end_input(self) -> None:
        self.ended = True
        self.log("talker input ended")

    async def outputs(self) -> AsyncIterator[CodecOut]:
        while (chunk := await self._queue.get()) is not None:
            yield chunk

    def close(self) -> None:
        self.closed = True


class Code2Wav:
    def __init__(self, log: Log) -> None:
        self.log = log
        self.fed: list[int] = []
        self.ended = False
        self.closed = False
        self._queue: asyncio.Queue[AudioOut | None] = asyncio.Queue()

    async def open(self) -> None:
        self.log("code2wav accepted")

    async def feed(self, piece: CodecOut) -> None:
        self.fed.append(piece.first_frame)
        await self._queue.put(AudioOut(np.ones(4, np.float32), 4 * piece.first_frame, 24000))

    async def end_input(self) -> None:
        self.ended = True
        await self._queue.put(None)

    async def outputs(self) -> AsyncIterator[AudioOut]:
        while (piece := await self._queue.get()) is not None:
            yield piece

    def close(self) -> None:
        self.closed = True


def pieces(n: int) -> list[ThinkerOut]:
    out = [ThinkerOut([i], f"t{i}", spoken=[i]) for i in range(n)]
    out[0].prompt_ids = [7, 8]
    out[0].cached_tokens = 1
    out[-1].finished, out[-1].finish_reason = True, "length"
    return out


async def run(chain: ChainRun) -> tuple[list[object], object]:
    events: list[object] = []

    async def emit(event: object) -> None:
        events.append(event)

    chain.emit = emit
    return events, await chain.run()


async def test_text_audio_and_summary_flow_through_every_stage():
    log = Log()
    thinker, talker, code2wav = Thinker(log, pieces(3)), Talker(log, finish_after=3), Code2Wav(log)
    events, done = await run(ChainRun(thinker, talker, code2wav, None, with_codes=True))  # type: ignore[arg-type]
    assert [e.delta for e in events if isinstance(e, TextEvent)] == ["t0", "t1", "t2"]
    assert [e.frame for e in events if isinstance(e, CodesEvent)] == [0, 1, 2]
    assert [e.first_sample for e in events if isinstance(e, AudioEvent)] == [0, 4, 8]
    assert talker.fed == [[0], [1], [2]] and code2wav.fed == [0, 1, 2] and code2wav.ended
    assert done.prompt_ids == [7, 8] and done.output_ids == [0, 1, 2] and done.cached_tokens == 1
    assert (done.finish_reason, done.frames, done.audio_samples) == ("length", 3, 12)
    assert done.ttft is not None and done.ttfp is not None
    assert thinker.closed and talker.closed and code2wav.closed


async def test_nothing_reaches_the_client_before_both_audio_stages_accepted():
    log, accept = Log(), asyncio.Event()
    talker = Talker(log, finish_after=2, accept=accept)
    events: list[object] = []

    async def emit(event: object) -> None:
        log(f"emit {type(event).__name__}")
        events.append(event)

    task = asyncio.ensure_future(ChainRun(Thinker(log, pieces(2)), talker, Code2Wav(log), emit).run())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not events and not talker.fed  # the thinker's first piece waits for the talker's accept
    accept.set()
    await task
    assert log.lines.index("talker accepted") < log.lines.index("emit TextEvent")


async def test_a_talker_that_finished_first_gets_no_more_input_and_its_input_is_ended():
    log = Log()
    thinker, talker, code2wav = Thinker(log, pieces(6)), Talker(log, finish_after=2), Code2Wav(log)
    events, done = await run(ChainRun(thinker, talker, code2wav, None))  # type: ignore[arg-type]
    assert len([e for e in events if isinstance(e, TextEvent)]) == 6  # the client still gets all text
    assert len(talker.fed) < 6 and talker.ended
    assert done.frames == 2 and not [e for e in events if isinstance(e, CodesEvent)]  # codes only asked


async def test_a_failing_stage_fails_the_request_and_closes_every_link():
    log = Log()
    thinker, talker, code2wav = Thinker(log, pieces(3)), Talker(log, 3, fail=True), Code2Wav(log)
    with pytest.raises(Unavailable) as failed:
        await run(ChainRun(thinker, talker, code2wav, None))  # type: ignore[arg-type]
    assert failed.value.stage == "talker"
    assert thinker.closed and talker.closed and code2wav.closed


async def test_text_alone_runs_the_thinker_only():
    log = Log()
    events, done = await run(ChainRun(Thinker(log, pieces(2)), None, None, None))  # type: ignore[arg-type]
    assert [type(e) for e in events] == [TextEvent, TextEvent] and done.frames == 0
    with pytest.raises(ValueError):
        ChainRun(Thinker(log, pieces(1)), Talker(log, 1), None, None)  # type: ignore[arg-type]
