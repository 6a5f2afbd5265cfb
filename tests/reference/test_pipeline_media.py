"""Media prompts through the in-process pipeline against the model's reference (greedy, float64):
the reference gets the same decoded arrays through the same processor (tests/media_reference.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnistream.engine.settings import EngineSettings
from omnistream.pipeline import GenerationRequest, Pipeline, collect
from tests.media_reference import MAX_FRAMES, MAX_TOKENS
from tests.media_samples import conversations

CASES = conversations()
TEXT_ONLY = [{"role": "user", "content": "Tell me a story about the sea."}]


@pytest.fixture(scope="module")
def pipeline(tiny_model_dir):
    with Pipeline(tiny_model_dir, EngineSettings(dtype="float64", max_batch=8)) as p:
        # Small budgets: media encode in several slices and prefill in several chunks, interleaved
        # with the decode steps of the others (parity must hold all the same).
        p.thinker.encode_budget = p.thinker.audio_window
        p.thinker.prefill_chunk = 16
        yield p


@pytest.fixture(scope="module")
def expected(media_expected):
    return media_expected


def _request(messages, use_audio_in_video=False) -> GenerationRequest:
    return GenerationRequest(
        messages=messages,
        max_tokens=MAX_TOKENS,
        max_audio_frames=MAX_FRAMES,
        initial_codec_chunk_frames=4,
        use_audio_in_video=use_audio_in_video,
    )


@pytest.mark.parametrize("name", list(CASES))
def test_media_prompt_matches_reference(pipeline, expected, name):
    messages, aiv = CASES[name]
    result = asyncio.run(collect(pipeline, _request(messages, aiv)))
    prompt_ids, tokens, codes = expected[name]
    assert result.prompt_ids == prompt_ids
    assert result.output_ids == tokens
    assert result.codes.shape[1] > 0
    np.testing.assert_array_equal(result.codes, codes)


def test_media_batched_with_text_matches_reference(pipeline, expected):
    names = list(CASES)

    async def run_all():
        requests = [_request(*CASES[n]) for n in names] + [_request(TEXT_ONLY)] * 2
        return await asyncio.gather(*(collect(pipeline, r) for r in requests))

    seen: list[int] = []
    pipeline.thinker.add_step_listener(lambda engine, _: seen.append(engine.stats.last_batch_size))
    results = asyncio.run(run_all())
    assert max(seen) > 1  # decode steps really were shared
    for name, result in zip(names, results, strict=False):
        _, tokens, codes = expected[name]
        assert result.output_ids == tokens, name
        np.testing.assert_array_equal(result.codes, codes, err_msg=name)
    solo_text = asyncio.run(collect(pipeline, _request(TEXT_ONLY)))
    for result in results[len(names) :]:
        assert result.output_ids == solo_text.output_ids
        np.testing.assert_array_equal(result.codes, solo_text.codes)
