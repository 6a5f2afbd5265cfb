"""On the tiny checkpoint `make run` serves, answers end by themselves through the whole stack
(omnistream/models/qwen3_omni/tiny_answer_end.py), and `ignore_eos` still gives exactly
`max_audio_frames` (the benchmark's fixed-length answers: the talker is told, TalkerOpen.ignore_eos)."""

from __future__ import annotations

import pytest

from omnistream.client import Client

from .conftest import gateway_process

SAMPLES_PER_FRAME, DECODE_TAIL = 1920, 555  # a full decode of n frames is n * 1920 - 555 samples


@pytest.fixture(scope="module")
def gateway(ending_stages):
    with gateway_process(ending_stages) as gateway:
        yield gateway


def test_a_typed_questions_spoken_answer_ends_within_seconds(gateway):
    with Client(gateway.address) as client:
        for seed in range(4):
            result = client.complete("What is the weather like today?", seed=seed)
            assert result.finish_reason == "stop"
            seconds = result.audio.size / result.sample_rate
            assert 0 < seconds < 10, (seed, seconds, len(result.token_ids))


def test_ignore_eos_still_speaks_exactly_max_audio_frames(gateway):
    with Client(gateway.address) as client:
        fixed = {"max_tokens": 30, "ignore_eos": True, "max_audio_frames": 40}
        result = client.complete("Tell me a story.", seed=1, **fixed)
    assert len(result.token_ids) == 30
    assert result.audio.size == 40 * SAMPLES_PER_FRAME - DECODE_TAIL
