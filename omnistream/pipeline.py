"""The in-process pipeline: the three engines in one process, wired by asyncio.

This is the offline API and the performance floor the services are measured against. Async-chunk
mode hands each stage its input as soon as the previous stage produces it; sequential mode hands
over only once the previous stage finished. Both run the same code path, so they produce identical
tokens, codes and audio and their timings compare fairly.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from omnistream.chain.run import ChainRun
from omnistream.engine.settings import EngineSettings, stage_settings
from omnistream.models.family import family_for
from omnistream.pipeline_links import LocalCode2Wav, LocalTalker, LocalThinker
from omnistream.request.chunk_plan import ChunkPlan, dynamic_initial_frames
from omnistream.request.generation import (  # re-exported: the pipeline's API speaks the request model
    MODES,
    AudioEvent,
    CodesEvent,
    DoneEvent,
    Event,
    GenerationRequest,
    TextEvent,
)
from omnistream.request.relay import Emit, relay
from omnistream.request.spoken import TokenPieces
from omnistream.request.stage_chain import STAGES, stage_opens

if TYPE_CHECKING:
    from omnistream.engine.api import Code2WavStageEngine, StageEngine, TalkerStageEngine, ThinkerStageEngine

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
        settings: EngineSettings,
        *,
        devices: Mapping[str, str] | None = None,
        code2wav_decode: str = "stream",
    ) -> None:
        """`settings`: what the three stages share, as `omnistream serve` takes it (engine settings
        of one stage, e.g. `PrefixCacheSettings(prefix_cache_gib=0)`: each stage takes the fields
        its own settings have, omnistream/engine/settings.py `stage_settings`). `devices` maps a
        stage to its own device (e.g. the thinker on cuda:0, the rest on cuda:1); a stage it does
        not name runs on `settings.device`."""
        self.family = family_for(model_dir)
        devices = devices or {}
        engines = {
            stage: self.family.engine(stage, model_dir, stage_settings(stage, settings, devices.get(stage)))
            for stage in STAGES
        }
        # The family built each stage's engine: each holds to its stage's protocol (engine_types.py).
        self.thinker = cast("ThinkerStageEngine", engines["thinker"])
        self.talker = cast("TalkerStageEngine", engines["talker"])
        self.code2wav = cast("Code2WavStageEngine", engines["code2wav"])
        self.code2wav.set_decode(code2wav_decode)  # "recompute": the benchmark's baseline
        self.max_batch = settings.max_batch
        self._active = 0
        # What the talker speaks of each answer (as the thinker service decides it): no tool call.
        self._pieces = TokenPieces(self.thinker.tokenizer)

    def start(self) -> Pipeline:
        for engine in self.engines:
            engine.start()
        return self

    def stop(self) -> None:
        for engine in self.engines:
            engine.stop()

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def engines(self) -> tuple[StageEngine, StageEngine, StageEngine]:
        return (self.thinker, self.talker, self.code2wav)

    def chunk_plan(self, request: GenerationRequest) -> ChunkPlan:
        initial = request.initial_codec_chunk_frames
        if initial is None:
            initial = dynamic_initial_frames(self._active, self.max_batch, request.codec_chunk_frames)
        return request.chunk_plan(initial)

    def links(
        self, request: GenerationRequest, request_id: str
    ) -> tuple[LocalThinker, LocalTalker | None, LocalCode2Wav | None]:
        """The request's chain over this process's engines (omnistream/pipeline_links.py)."""
        opens = stage_opens(request, self.chunk_plan(request) if request.return_audio else None)
        thinker = LocalThinker(self.thinker, request_id, request, opens, self._pieces)
        if opens.talker is None or opens.plan is None:
            return thinker, None, None
        talker = LocalTalker(
            self.talker,
            self.family,
            request_id,
            opens.talker,
            opens.plan,
            opens.mode,
            lookahead=self.code2wav.lookahead_frames,
        )
        code2wav = LocalCode2Wav(self.code2wav, request_id, opens.plan, opens.mode, self.code2wav.sample_rate)
        return thinker, talker, code2wav

    async def generate(
        self, request: GenerationRequest, request_id: str | None = None
    ) -> AsyncIterator[Event]:
        """Stream events for one request, ending with its DoneEvent; closing the iterator aborts it
        in every engine. The chain is the gateway's (omnistream/chain/run.py), over the engines."""
        request.validate()
        rid = request_id or uuid.uuid4().hex
        links = self.links(request, rid)

        async def run(emit: Emit) -> None:
            await emit(await ChainRun(*links, emit, with_codes=True).run())

        self._active += 1
        try:
            async for item in relay(run, maxsize=1024):
                yield item
        finally:  # the chain closed its links (aborting the request in every engine) before relay returned
            self._active -= 1


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
