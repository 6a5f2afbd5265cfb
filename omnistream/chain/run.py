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
- the first failure of any stage cancels the others and is raised as it is.

What it counts (tokens, frames, samples, first token and first audio) are named fields, read into
the request's summary (`done`) and, by the gateway, into its trace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

from omnistream.chain.links import Code2WavLink, TalkerLink, ThinkerLink
from omnistream.request.generation import AudioEvent, CodesEvent, DoneEvent, TextEvent
from omnistream.request.relay import Emit
from omnistream.request.stage_outputs import ThinkerOut


class ChainRun:
    def __init__(
        self,
        thinker: ThinkerLink,
        talker: TalkerLink | None,
        code2wav: Code2WavLink | None,
        emit: Emit,
        *,
        with_codes: bool = False,
    ) -> None:
        if (talker is None) != (code2wav is None):
            raise ValueError("a chain has both audio stages or neither")
        self.thinker, self.talker, self.code2wav = thinker, talker, code2wav
        self.emit = emit
        self.with_codes = with_codes
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
        self._talker_finished = False
        self._talker_input_ended = False

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
        async for piece in self.thinker.outputs():
            if piece.prompt_ids:
                self.prompt_ids = list(piece.prompt_ids)
                self.cached_tokens = piece.cached_tokens
            self.output_ids.extend(piece.token_ids)
            if self.first_token_at is None:
                self.first_token_at = time.perf_counter()
            await self._audio_accepted()  # at once after the first piece: they accept in a round trip
            await self.emit(TextEvent(list(piece.token_ids), piece.text_delta))
            await self._to_talker(piece)
            if piece.finished:
                self.finish_reason = piece.finish_reason or "stop"
        if self.talker is not None:
            await self._audio_accepted()
            await self._end_talker_input()

    async def _to_talker(self, piece: ThinkerOut) -> None:
        if self.talker is None:
            return
        if self._talker_finished:  # codec end or max frames before the thinker's end: input is moot
            await self._end_talker_input()
            return
        if not self._talker_input_ended:
            await self.talker.feed(piece)

    async def _end_talker_input(self) -> None:
        if self.talker is not None and not self._talker_input_ended:
            self._talker_input_ended = True
            await self.talker.end_input()

    async def _run_talker(self) -> None:
        assert self.talker is not None and self.code2wav is not None
        await self.talker.open()
        self._talker_accepted.set()
        async for chunk in self.talker.outputs():
            if self.with_codes and chunk.frames and chunk.codes is not None:
                for j in range(chunk.frames):
                    await self.emit(CodesEvent(chunk.first_frame + j, chunk.codes[:, j].tolist()))
            self.frames += chunk.frames
            if chunk.finished:
                self._talker_finished = True
            await self._code2wav_accepted.wait()
            await self.code2wav.feed(chunk)
        await self._code2wav_accepted.wait()
        await self.code2wav.end_input()

    async def _run_code2wav(self) -> None:
        assert self.code2wav is not None
        await self.code2wav.open()
        self._code2wav_accepted.set()
        async for piece in self.code2wav.outputs():
            if piece.audio.size:
                if self.first_audio_at is None:
                    self.first_audio_at = time.perf_counter()
                self.samples += piece.audio.size
                await self.emit(AudioEvent(piece.audio, piece.first_sample, piece.sample_rate))


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
