"""One request's run through the stage chain: every hand-off rule between the stages, once.

`ChainRun` is the same for the gateway (gRPC links) and the in-process pipeline (engine links):

- the three stages open at once; nothing of the thinker reaches the client or the talker before
  both audio stages accepted their open (a refusal fails the request before its first event, so the
  gateway can move it to another replica, and no write goes to a stream its stage refused);
- each thinker piece goes to the client, then to the talker; once the talker has finished (codec
  end, max frames) its input is moot and is ended, and the thinker's end ends it otherwise;
- each talker chunk goes to Code2Wav as it comes (after Code2Wav accepted), its end ends Code2Wav's
  input; codec frames reach the client only `with_codes` (tests and tools that compare codes);
- audio goes to the client as Code2Wav decodes it;
- the first failure of any stage cancels the others and is raised as it is, unless its replica was
  lost and a `Resumer` (resume.py) gives a sibling: a thinker is re-opened there with the answer so
  far, which it continues; a talker or Code2Wav is given again what the lost one was fed, and the
  chain passes on only what comes after what it already had (frames, samples).

What it counts (tokens, frames, samples, first token and first audio) are named fields, read into
the request's summary (`done`) and, by the gateway, into its trace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from omnistream.chain.links import Code2WavLink, TalkerLink, ThinkerLink
from omnistream.chain.resume import Loss, Replay, Resumer, replay_to
from omnistream.request.errors import InternalError, OmniError
from omnistream.request.generation import AudioEvent, CodesEvent, DoneEvent, TextEvent
from omnistream.request.relay import Emit
from omnistream.request.stage_outputs import AudioOut, CodecOut, ThinkerOut

T = TypeVar("T")
L = TypeVar("L", ThinkerLink, TalkerLink, Code2WavLink)


class ChainRun:
    def __init__(
        self,
        thinker: ThinkerLink,
        talker: TalkerLink | None,
        code2wav: Code2WavLink | None,
        emit: Emit,
        *,
        with_codes: bool = False,
        resumer: Resumer | None = None,
    ) -> None:
        if (talker is None) != (code2wav is None):
            raise ValueError("a chain has both audio stages or neither")
        self.thinker, self.talker, self.code2wav = thinker, talker, code2wav
        self.emit = emit
        self.with_codes = with_codes
        self.resumer = resumer
        self.started = time.perf_counter()
        self.prompt_ids: list[int] = []
        self.output_ids: list[int] = []
        self.cached_tokens = 0
        self.finish_reason = "stop"
        self.frames = 0
        self.samples = 0
        self.first_token_at: float | None = None
        self.first_audio_at: float | None = None
        self._talker_accepted = asyncio.Event()
        self._code2wav_accepted = asyncio.Event()
        self._thinker_finished = False
        self._talker_finished = False
        self._code2wav_finished = False
        self._talker_input_ended = False
        self._losses = {stage: Loss() for stage in ("thinker", "talker", "code2wav")}
        # What each audio stage was fed, for a sibling to regenerate from (only with a resumer).
        self._to_talker_replay: Replay[ThinkerOut] = Replay(keep=resumer is not None)
        self._to_code2wav_replay: Replay[CodecOut] = Replay(keep=resumer is not None)

    async def run(self) -> DoneEvent:
        """Run the request to its end; its summary. The links are closed however it ends."""
        try:
            pumps: list[Coroutine[Any, Any, None]] = [self._run_thinker()]
            if self.talker is not None:
                pumps += [self._run_talker(), self._run_code2wav()]
            await all_or_none(pumps)
            return self.done()
        finally:
            self.close()

    def close(self) -> None:
        for link in (self.thinker, self.talker, self.code2wav):
            if link is not None:
                link.close()

    def done(self) -> DoneEvent:
        return DoneEvent(
            prompt_ids=self.prompt_ids,
            output_ids=self.output_ids,
            finish_reason=self.finish_reason,
            frames=self.frames,
            audio_samples=self.samples,
            ttft=self.ttft,
            ttfp=self.ttfp,
            e2e=time.perf_counter() - self.started,
            cached_tokens=self.cached_tokens,
        )

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started

    @property
    def ttfp(self) -> float | None:
        return None if self.first_audio_at is None else self.first_audio_at - self.started

    async def _audio_accepted(self) -> None:
        if self.talker is not None:
            await self._talker_accepted.wait()
            await self._code2wav_accepted.wait()

    async def _run_thinker(self) -> None:
        await self.thinker.open()
        await self._drain(
            lambda: self.thinker.outputs(),
            self._from_thinker,
            lambda: self._thinker_finished,
            self._move_thinker,
        )
        if self.talker is not None:
            await self._audio_accepted()
            await self._end_talker_input()

    async def _from_thinker(self, piece: ThinkerOut) -> None:
        if piece.prompt_ids:
            self.prompt_ids = list(piece.prompt_ids)
            self.cached_tokens = piece.cached_tokens
        self.output_ids.extend(piece.token_ids)
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self._heard("thinker")
        await self._audio_accepted()  # at once after the first piece: they accept in a round trip
        await self.emit(TextEvent(list(piece.token_ids), piece.text_delta))
        await self._to_talker(piece)
        if piece.finished:
            self._thinker_finished = True
            self.finish_reason = piece.finish_reason or "stop"

    async def _move_thinker(self, error: OmniError) -> None:
        """The thinker lost mid-answer: re-opened on a sibling with the answer so far, which it
        continues (its draws are keyed by the token's index). A sibling's refusal is read in its
        output, after the open: a later move, whose answer is still the first loss (`Loss`)."""

        async def sibling(resumer: Resumer, error: OmniError) -> ThinkerLink | None:
            return await resumer.thinker(error, list(self.output_ids))

        await self._move("thinker", error, sibling, lambda link: link.open())

    async def _to_talker(self, piece: ThinkerOut) -> None:
        if self.talker is None:
            return
        if self._talker_finished:  # codec end or max frames before the thinker's end: input is moot
            await self._end_talker_input()
            return
        if not self._talker_input_ended and self._to_talker_replay.due(piece):
            await self.talker.feed(piece)

    async def _end_talker_input(self) -> None:
        if self.talker is not None and not self._talker_input_ended:
            self._talker_input_ended = True
            if self._to_talker_replay.end():
                await self.talker.end_input()

    async def _run_talker(self) -> None:
        assert self.talker is not None and self.code2wav is not None
        await self.talker.open()
        self._talker_accepted.set()
        talker = self.talker
        await self._drain(
            lambda: (self.talker or talker).outputs(),
            self._from_talker,
            lambda: self._talker_finished,  # its end came: nothing of it is lost
            self._move_talker,
        )
        await self._code2wav_accepted.wait()
        if self._to_code2wav_replay.end():
            await self._to_code2wav(self.code2wav.end_input())

    async def _from_talker(self, chunk: CodecOut) -> None:
        assert self.code2wav is not None
        if chunk.frames and chunk.first_frame != self.frames:
            raise InternalError(f"talker sent frame {chunk.first_frame} where {self.frames} was due")
        if self.with_codes and chunk.frames and chunk.codes is not None:
            for j in range(chunk.frames):
                await self.emit(CodesEvent(chunk.first_frame + j, chunk.codes[:, j].tolist()))
        self.frames += chunk.frames
        if chunk.finished:
            self._talker_finished = True
        await self._code2wav_accepted.wait()
        if self._to_code2wav_replay.due(chunk):
            await self._to_code2wav(self.code2wav.feed(chunk))

    async def _to_code2wav(self, write: Coroutine[Any, Any, None]) -> None:
        """A write to Code2Wav; with a resumer, a failed one is moot: Code2Wav's own output reports
        the loss, and its pump moves it to a sibling with everything recorded."""
        if self.resumer is None:
            await write
            return
        try:
            await write
        except OmniError as exc:
            if exc.stage != "code2wav":
                raise

    async def _move_talker(self, error: OmniError) -> None:
        """The talker lost mid-stream: on a sibling, given again what it was fed."""
        replay = self._to_talker_replay

        async def sibling(resumer: Resumer, error: OmniError) -> TalkerLink | None:
            return await resumer.talker(error, self.frames)

        await self._move("talker", error, sibling, lambda link: replay_to(link, replay))

    async def _run_code2wav(self) -> None:
        assert self.code2wav is not None
        await self.code2wav.open()
        self._code2wav_accepted.set()
        code2wav = self.code2wav
        await self._drain(
            lambda: (self.code2wav or code2wav).outputs(),
            self._from_code2wav,
            lambda: self._code2wav_finished,
            self._move_code2wav,
        )

    async def _from_code2wav(self, piece: AudioOut) -> None:
        audio, first = piece.audio, piece.first_sample
        if audio.size and first > self.samples:
            raise InternalError(f"code2wav sent sample {first} where {self.samples} was due")
        if first < self.samples:  # regenerated after a resume: the client has these already
            audio = audio[self.samples - first :]
        if audio.size:
            if self.first_audio_at is None:
                self.first_audio_at = time.perf_counter()
            self._heard("talker", "code2wav")
            self.samples += audio.size
            await self.emit(AudioEvent(audio, self.samples - audio.size, piece.sample_rate))
        if piece.finished:
            self._code2wav_finished = True

    def _heard(self, *stages: str) -> None:
        """Output goes out again after a move of `stages`: how long its listener waited for it."""
        for stage in stages:
            gap = self._losses[stage].gap()
            if gap is not None and self.resumer is not None:
                self.resumer.heard(stage, gap)

    async def _move_code2wav(self, error: OmniError) -> None:
        """Code2Wav lost mid-stream: on a sibling, given every frame again."""
        replay = self._to_code2wav_replay

        async def sibling(resumer: Resumer, error: OmniError) -> Code2WavLink | None:
            return await resumer.code2wav(error)

        await self._move("code2wav", error, sibling, lambda link: replay_to(link, replay))

    async def _drain(
        self,
        outputs: Callable[[], AsyncIterator[T]],
        take: Callable[[T], Awaitable[None]],
        finished: Callable[[], bool],
        move: Callable[[OmniError], Awaitable[None]],
    ) -> None:
        """Read a stage's outputs to their end; a failure before its end moves the stage (`move`
        raises what the client gets when it cannot) and reading goes on from its new link."""
        while True:
            try:
                async for item in outputs():
                    await take(item)
                return
            except OmniError as exc:
                if finished():
                    return
                await move(exc)

    async def _move(
        self,
        stage: str,
        error: OmniError,
        sibling: Callable[[Resumer, OmniError], Awaitable[L | None]],
        start: Callable[[L], Awaitable[None]],
    ) -> None:
        """`stage` goes on at the link `sibling` gives, which `start` opens (and gives what it needs);
        a sibling that refuses or is lost in turn is moved again. Raises the stage's first loss since
        its last output when it cannot move."""
        lost = self._losses[stage].seen(error)
        while True:
            link = None if self.resumer is None else await sibling(self.resumer, error)
            if link is None:
                raise lost
            getattr(self, stage).close()
            setattr(self, stage, link)
            try:
                await start(link)
                return
            except OmniError as exc:  # the sibling refused or was lost too
                error = exc


async def all_or_none(coros: list[Coroutine[Any, Any, None]]) -> None:
    """Run the pumps together; the first failure cancels the others and is raised as it is."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            error = task.exception()
            if error is not None:
                raise error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
