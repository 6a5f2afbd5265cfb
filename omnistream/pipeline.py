"""The in-process pipeline: the three engines in one process, wired by asyncio.

This is the offline API and the performance floor the services are measured against. Async-chunk
mode hands each stage its input as soon as the previous stage produces it; sequential mode hands
over only once the previous stage finished. Both run the same code path, so they produce identical
tokens, codes and audio and their timings compare fairly.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

from omnistream.engine.load_options import DEFAULT_MAX_BATCH, DEFAULT_PREFILL_CHUNK, LoadOptions
from omnistream.models.family import family_for
from omnistream.models.qwen3_omni.codec_chunks import ChunkPlan, FrameShipper, dynamic_initial_frames
from omnistream.models.qwen3_omni.talker.deep_rows import DeepRows
from omnistream.request.errors import InvalidRequest
from omnistream.request.generation import (  # re-exported: the pipeline's API speaks the request model
    MODES,
    AudioEvent,
    CodesEvent,
    DoneEvent,
    Event,
    GenerationRequest,
    TextEvent,
)
from omnistream.request.media import has_media
from omnistream.request.relay import Emit, relay
from omnistream.request.spoken import TokenPieces
from omnistream.request.stage_chain import STAGES, CodecFeed, InputHold, TalkerFeed, stage_opens

__all__ = [
    "MODES",
    "AudioEvent",
    "CodesEvent",
    "DoneEvent",
    "Event",
    "GenerationRequest",
    "Pipeline",
    "TextEvent",
    "collect",
]


class Pipeline:
    def __init__(
        self,
        model_dir: str,
        options: LoadOptions = LoadOptions(),
        max_batch: int = DEFAULT_MAX_BATCH,
        max_model_len: int = 4096,
        code2wav_decode: str = "stream",
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        devices: dict[str, str] | None = None,
        prefix_cache_bytes: int | None = None,
    ) -> None:
        """`devices` maps a stage to its own device (e.g. the thinker on cuda:0, the rest on
        cuda:1); a stage it does not name runs on `options.device`. `prefix_cache_bytes`: each of
        the thinker's and the talker's prefix cache budget (None: their default; 0: off)."""
        self.family = family_for(model_dir)
        devices = devices or {}
        self.thinker, self.talker, self.code2wav = (
            self.family.engine(
                stage,
                model_dir,
                options.on(devices.get(stage)),
                max_batch=max_batch,
                max_model_len=max_model_len,
                prefill_chunk=prefill_chunk,
                prefix_cache_bytes=prefix_cache_bytes,
            )
            for stage in STAGES
        )
        self.code2wav.set_decode(code2wav_decode)  # "recompute": the benchmark's baseline
        self.max_batch = max_batch
        self._active = 0
        # What the talker speaks of each answer (as the thinker service decides it): no tool call.
        self._pieces = TokenPieces(self.thinker.tokenizer)

    def start(self) -> Pipeline:
        for engine in (self.thinker, self.talker, self.code2wav):
            engine.start()
        return self

    def stop(self) -> None:
        for engine in (self.thinker, self.talker, self.code2wav):
            engine.stop()

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def engines(self):
        return (self.thinker, self.talker, self.code2wav)

    def chunk_plan(self, request: GenerationRequest) -> ChunkPlan:
        initial = request.initial_codec_chunk_frames
        if initial is None:
            initial = dynamic_initial_frames(self._active, self.max_batch, request.codec_chunk_frames)
        return request.chunk_plan(initial)

    async def generate(
        self, request: GenerationRequest, request_id: str | None = None
    ) -> AsyncIterator[Event]:
        """Stream events for one request; closing the iterator aborts it in every engine."""
        request.validate()
        rid = request_id or uuid.uuid4().hex
        started = time.perf_counter()
        prompt_ids = request.prompt_ids
        opens = stage_opens(request, self.chunk_plan(request) if request.return_audio else None)
        media = None
        messages, tools = request.messages or [], request.tools
        if prompt_ids is None and has_media(request.messages):
            # The processor's feature extraction is CPU work: a thread, as tokenizing is.
            media = await asyncio.to_thread(
                self.thinker.prepare_media, messages, opens.thinker.use_audio_in_video, tools
            )
            prompt_ids = media.prompt_ids
        elif prompt_ids is None:
            prompt_ids = await asyncio.to_thread(self.thinker.encode_chat, messages, tools)
        out: Emit  # set by run_all: hands an event to the consumer
        spoken = grammar = None
        if opens.thinker.assistant_text is not None:
            spoken = await asyncio.to_thread(self.thinker.encode_assistant_text, opens.thinker.assistant_text)
        elif opens.thinker.structured_output is not None:  # off the loop, within the thinker's bound
            grammar = await self.thinker.compile_grammar(opens.thinker.structured_output)
        thinker_out = self.thinker.add_request(
            rid, prompt_ids, opens.thinker, media=media, spoken=spoken, grammar=grammar
        )
        talker_out = code2wav_out = None
        try:
            if opens.talker is not None and opens.plan is not None:
                talker_out = self.talker.add_request(rid, opens.talker)
                code2wav_out = self.code2wav.add_request(rid, opens.plan)
        except BaseException:
            for engine in self.engines:
                engine.abort(rid)
            raise
        self._active += 1
        output_ids: list[int] = []
        frames: list[list[int]] = []
        marks: dict[str, float] = {}
        finish = {"reason": "stop", "samples": 0}
        # The receiving ends of the two edges, as in the stage services (sequential mode holds there).
        talker_hold = InputHold(opens.mode, TalkerFeed.merge)
        code2wav_hold = InputHold(opens.mode, CodecFeed.merge)

        def feed_talker(feed: TalkerFeed) -> None:
            for piece in talker_hold.push(feed, feed.last):
                try:
                    self.talker.feed_piece(rid, piece)
                except InvalidRequest:
                    if self.talker.has_request(rid):
                        raise
                    # The talker finished first (max frames while the thinker still speaks): its
                    # input is moot now, as the gateway's wiring has it. A talker that failed
                    # reports that on its own stream.
                    return

        def feed_code2wav(feed: CodecFeed) -> None:
            for piece in code2wav_hold.push(feed, feed.last):
                self.code2wav.feed(rid, piece.codes, piece.last)

        speech = self._pieces.filter(request.structured_output)

        async def pump_thinker() -> None:
            first = True
            async for step in thinker_out:
                output_ids.extend(step.token_ids)
                marks.setdefault("ttft", time.perf_counter())
                await out(TextEvent(step.token_ids, step.text_delta))
                if talker_out is not None:
                    prompt = list(prompt_ids) if first else None
                    hidden = None
                    if step.multimodal_positions:
                        hidden = DeepRows(step.multimodal_positions, step.prompt_hidden)
                    said = speech.push(step.token_ids) + (speech.finish() if step.finished else [])
                    feed_talker(TalkerFeed(said, step.finished, prompt, hidden, step.media_layout))
                first = False
                if step.finished:
                    finish["reason"] = step.finish_reason or "stop"

        async def pump_talker() -> None:
            assert talker_out is not None and opens.plan is not None
            shipper = FrameShipper(opens.plan, frames, lookahead=self.code2wav.lookahead_frames)
            async for step in talker_out:
                if step.codes is not None:
                    frames.append(step.codes)
                    await out(CodesEvent(step.frame, step.codes))
                if shipper.due(step.finished):
                    first_frame, codes = shipper.take()
                    feed_code2wav(CodecFeed(codes, first_frame, step.finished))

        async def pump_code2wav() -> None:
            assert code2wav_out is not None
            async for chunk in code2wav_out:
                if chunk.audio.size:
                    marks.setdefault("ttfp", time.perf_counter())
                    finish["samples"] += chunk.audio.size
                    await out(AudioEvent(chunk.audio, chunk.first_sample, self.code2wav.sample_rate))

        async def run_all(emit: Emit) -> None:
            nonlocal out
            out = emit
            pumps = [pump_thinker()]
            if talker_out is not None:
                pumps += [pump_talker(), pump_code2wav()]
            await asyncio.gather(*pumps)

        try:
            async for item in relay(run_all, maxsize=1024):
                yield item
            yield DoneEvent(
                prompt_ids=list(prompt_ids),
                output_ids=output_ids,
                finish_reason=finish["reason"],
                frames=len(frames),
                audio_samples=finish["samples"],
                ttft=marks["ttft"] - started if "ttft" in marks else None,
                ttfp=marks["ttfp"] - started if "ttfp" in marks else None,
                e2e=time.perf_counter() - started,
            )
        finally:
            self._active -= 1
            for engine in self.engines:
                engine.abort(rid)


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    output_ids: list[int]
    text: str
    codes: np.ndarray  # [codebooks, T]
    audio: np.ndarray  # float32
    done: DoneEvent


async def collect(
    pipeline: Pipeline,
    request: GenerationRequest,
    request_id: str | None = None,
    on_text: Callable[[str], None] | None = None,
) -> GenerationResult:
    """Run one request to the end; `on_text` sees each text delta as it streams."""
    text, frames, audio = [], [], []
    done = None
    async for event in pipeline.generate(request, request_id):
        if isinstance(event, TextEvent):
            text.append(event.delta)
            if on_text is not None:
                on_text(event.delta)
        elif isinstance(event, CodesEvent):
            frames.append(event.codes)
        elif isinstance(event, AudioEvent):
            audio.append(event.audio)
        elif isinstance(event, DoneEvent):
            done = event
    assert done is not None
    empty = np.zeros((pipeline.code2wav.num_quantizers, 0), np.int64)
    codes = np.array(frames, dtype=np.int64).T if frames else empty
    wav = np.concatenate(audio) if audio else np.zeros(0, np.float32)
    return GenerationResult(done.prompt_ids, done.output_ids, "".join(text), codes, wav, done)
