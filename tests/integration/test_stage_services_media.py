"""Media prompts through the stage services (gRPC, real processes) against the transformers
reference: the gateway's wiring sends decoded media in ThinkerOpen and forwards the thinker's deep
rows and media layout to the talker."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.media_reference import MAX_FRAMES, MAX_TOKENS, expected_outputs
from tests.media_samples import conversations

from .stage_calls import collect_services, make_request

CASES = conversations()


@pytest.fixture(scope="module")
def expected(tiny_model_dir):
    return expected_outputs(tiny_model_dir)


def _request(messages, use_audio_in_video=False):
    return make_request(
        messages, max_tokens=MAX_TOKENS, max_audio_frames=MAX_FRAMES, use_audio_in_video=use_audio_in_video
    )


def test_media_prompts_match_reference_alone_and_batched(stages, expected):
    names = list(CASES)
    solo = {
        n: asyncio.run(collect_services(stages, _request(*CASES[n]), f"media-{n.replace('_', '-')}"))
        for n in names
    }

    async def run_all():
        runs = [
            collect_services(stages, _request(*CASES[n]), f"media-batch-{n.replace('_', '-')}") for n in names
        ]
        text = [{"role": "user", "content": "Tell me a story about the sea."}]
        runs += [collect_services(stages, _request(text), f"media-batch-text-{i}") for i in range(2)]
        return await asyncio.gather(*runs)

    batched = dict(zip(names, asyncio.run(run_all()), strict=False))
    for runs in (solo, batched):
        for name, (_, codes, audio, done) in runs.items():
            prompt_ids, tokens, ref_codes = expected[name]
            assert done.prompt_ids == prompt_ids, name
            assert done.output_ids == tokens, name
            assert codes.shape[0] == 16 and audio.size > 0
            np.testing.assert_array_equal(codes, ref_codes, err_msg=name)
