"""A stage lost mid-stream and resumed on a sibling (omnistream/chain/resume.py) gives the answer of a
run without the loss (a thinker re-opened with the answer so far, a talker or Code2Wav given again
what it was fed): the same text tokens, codes and audio samples, nothing twice and
nothing missing. Real engines in this process (float64); a sibling is the same engines under a new
request id, which is what another replica of the same checkpoint computes. The loss is a link that
raises what a broken gRPC link raises (Unavailable naming its stage) after some of its outputs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from omnistream.chain.run import ChainRun
from omnistream.engine.settings import EngineSettings
from omnistream.pipeline import GenerationRequest, Pipeline
from omnistream.request.errors import OmniError, Unavailable
from omnistream.request.generation import AudioEvent, CodesEvent, DoneEvent, TextEvent
from omnistream.request.sampling_params import SamplingParams

BUILD_PARAMS = [
    "never-ending",
    "ending",
    pytest.param("seed7-h96", marks=pytest.mark.slow),
    pytest.param("real-shaped", marks=pytest.mark.slow),
]
MESSAGES = [{"role": "user", "content": "Tell me a story about the sea."}]


@pytest.fixture(scope="module", params=BUILD_PARAMS)
def pipeline(request, build_dirs):
    with Pipeline(build_dirs(request.param), EngineSettings(dtype="float64", max_batch=8)) as p:
        yield p


def _request(sampled: bool) -> GenerationRequest:
    talker = SamplingParams(temperature=0.9, top_k=50, seed=7) if sampled else SamplingParams()
    thinker = SamplingParams(temperature=0.9, top_p=0.95, seed=11) if sampled else SamplingParams()
    return GenerationRequest(
        messages=MESSAGES,
        max_tokens=16,
        max_audio_frames=30,
        sampling=thinker,
        talker_sampling=talker,
        initial_codec_chunk_frames=2,
        codec_chunk_frames=4,
    )


class Lost:
    """A link that breaks after `after` of its outputs or at its last one (which it never passes on),
    whichever comes first, as a cut gRPC link does (its stage's Unavailable); everything else is the
    real link's. How many outputs a stage gives depends on timing (a producer ahead of its reader
    ships several steps in one), so "the last" is the one that says it finished."""

    def __init__(self, link: Any, stage: str, after: int | None) -> None:
        self.link, self.stage, self.after = link, stage, after
        self.broke = False

    async def open(self) -> None:
        await self.link.open()

    async def feed(self, piece: Any) -> None:
        await self.link.feed(piece)

    async def end_input(self) -> None:
        await self.link.end_input()

    async def outputs(self) -> AsyncIterator[Any]:
        n = 0
        async for item in self.link.outputs():
            if n == self.after or item.finished:
                self.broke = True
                raise Unavailable(f"{self.stage}: connection to the stage lost", stage=self.stage)
            n += 1
            yield item

    def close(self) -> None:
        self.link.close()


class SameEngines:
    """The chain's Resumer: a sibling is a fresh link to the same engines (another replica of the same
    checkpoint), `limit` moves at most."""

    def __init__(self, pipeline: Pipeline, request: GenerationRequest, rid: str, limit: int = 2) -> None:
        self.pipeline, self.request, self.rid, self.limit = pipeline, request, rid, limit
        self.moves: list[tuple[str, int]] = []
        self.gaps: list[str] = []

    def _links(self) -> tuple[Any, Any, Any]:
        return self.pipeline.links(self.request, f"{self.rid}.m{len(self.moves)}")

    async def thinker(self, error: OmniError, answer_ids: list[int]) -> Any:
        if len(self.moves) >= self.limit:
            return None
        self.moves.append(("thinker", len(answer_ids)))
        thinker = self._links()[0]
        thinker.opens = replace(
            thinker.opens, thinker=replace(thinker.opens.thinker, answer_ids=tuple(answer_ids))
        )
        return thinker

    async def talker(self, error: OmniError, start_frame: int) -> Any:
        if len(self.moves) >= self.limit:
            return None
        self.moves.append(("talker", start_frame))
        talker = self._links()[1]
        talker.start_frame = start_frame
        return talker

    async def code2wav(self, error: OmniError) -> Any:
        if len(self.moves) >= self.limit:
            return None
        self.moves.append(("code2wav", -1))
        return self._links()[2]

    def heard(self, stage: str, gap_s: float) -> None:
        self.gaps.append(stage)


async def _run(pipeline: Pipeline, request: GenerationRequest, rid: str, lose=None, resumer=None):
    """(tokens, codes, audio, done) of one run; `lose` (stage, after) breaks that link."""
    thinker, talker, code2wav = pipeline.links(request, rid)
    if lose is not None:
        stage, after = lose
        if stage == "thinker":
            thinker = Lost(thinker, stage, after)
        elif stage == "talker":
            talker = Lost(talker, stage, after)
        else:
            code2wav = Lost(code2wav, stage, after)
    events: list[Any] = []

    async def emit(event: Any) -> None:
        events.append(event)

    done = await ChainRun(thinker, talker, code2wav, emit, with_codes=True, resumer=resumer).run()
    tokens = [t for e in events if isinstance(e, TextEvent) for t in e.token_ids]
    codes = [(e.frame, e.codes) for e in events if isinstance(e, CodesEvent)]
    audio = [e for e in events if isinstance(e, AudioEvent)]
    starts = [e.first_sample for e in audio]
    wav = np.concatenate([e.audio for e in audio])
    assert starts == list(np.cumsum([0] + [e.audio.size for e in audio[:-1]])), "audio gap or overlap"
    assert [f for f, _ in codes] == list(range(len(codes))), "frames twice or missing"
    assert isinstance(done, DoneEvent)
    return tokens, codes, wav, done


# Where each loss happens: before the stage's first output, mid-answer, at its last output (None: the
# thinker's end, the talker's last chunk, Code2Wav's last window).
LOSSES = [(stage, at) for stage in ("thinker", "talker", "code2wav") for at in (0, 3, None)]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_a_lost_stage_resumed_on_a_sibling_gives_the_uninterrupted_answer(pipeline, sampled):
    request = _request(sampled)

    async def main() -> None:
        want = await _run(pipeline, request, "whole")
        for stage, at in LOSSES:
            resumer = SameEngines(pipeline, request, f"lost-{stage}-{at}")
            got = await _run(pipeline, request, f"lost-{stage}-{at}", (stage, at), resumer)
            label = (stage, at, sampled)
            assert resumer.moves and resumer.moves[0][0] == stage, label
            assert got[0] == want[0], label
            assert got[1] == want[1], label
            np.testing.assert_array_equal(got[2], want[2], err_msg=str(label))
            assert got[3].frames == want[3].frames and got[3].audio_samples == want[3].audio_samples, label
            # Its next output was measured, once (a loss at the last one may leave no audio to come).
            assert resumer.gaps == [stage] or (at is None and not resumer.gaps), label
            assert got[3].prompt_ids == want[3].prompt_ids and got[3].finish_reason == want[3].finish_reason
        assert want[3].frames > 0 and want[3].audio_samples > 0

    asyncio.run(main())
    # Nothing of a lost or resumed request stays in any engine.
    for engine in pipeline.engines:
        assert engine.num_requests == 0, engine


def test_without_a_sibling_the_loss_is_the_answer(pipeline):
    """No resume left: the request ends with the loss's error, as before, and frees every engine."""
    request = _request(False)
    resumer = SameEngines(pipeline, request, "no-sibling", limit=0)
    with pytest.raises(Unavailable, match="talker"):
        asyncio.run(_run(pipeline, request, "no-sibling", ("talker", 2), resumer))
    for engine in pipeline.engines:
        assert engine.num_requests == 0, engine
