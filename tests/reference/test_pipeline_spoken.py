"""The talker speaks an answer's words, never its tool call (omnistream/request/spoken.py), through
the in-process pipeline: a given answer (speech) with a call is heard exactly as the same words
without it (greedy), and an answer that is only a call is not heard at all."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnistream.engine.settings import EngineSettings
from omnistream.pipeline import GenerationRequest, Pipeline, collect
from omnistream.request.structured import StructuredOutput

QUESTION = "What is the weather in Paris?"
WORDS = "Let me look that up."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
MAX_FRAMES = 30


@pytest.fixture(scope="module")
def pipeline(tiny_model_dir):
    with Pipeline(tiny_model_dir, EngineSettings(dtype="float64", max_batch=4)) as p:
        yield p


def _answer(pipeline: Pipeline, text: str, **kw):
    request = GenerationRequest(
        messages=[{"role": "user", "content": QUESTION}],
        assistant_text=text,
        max_audio_frames=MAX_FRAMES,
        initial_codec_chunk_frames=4,
        **kw,
    )
    return asyncio.run(collect(pipeline, request))


def test_words_with_a_call_sound_as_the_words_alone(pipeline):
    alone = _answer(pipeline, WORDS)
    assert alone.codes.shape[1] > 0 and alone.audio.size > 0
    for text in (f"{WORDS} {CALL}", f"{WORDS}\n{CALL}\n", f"{WORDS} {CALL} {CALL}"):
        with_call = _answer(pipeline, text)
        assert with_call.text == text  # the client still gets every token: its parser finds the call
        assert len(with_call.output_ids) > len(alone.output_ids)
        np.testing.assert_array_equal(with_call.codes, alone.codes)
        np.testing.assert_array_equal(with_call.audio, alone.audio)


def test_a_call_alone_has_no_audio_and_ends_cleanly(pipeline):
    result = _answer(pipeline, CALL)
    assert result.text == CALL and result.done.finish_reason == "stop"
    assert result.codes.shape[1] == 0 and result.audio.size == 0
    assert result.done.frames == 0 and result.done.audio_samples == 0


def test_a_json_answer_is_not_spoken(pipeline):
    """A structured answer is data: the request with response_format JSON has no audio (the given
    answer is not generated, so the grammar does not apply; the filter is what is tested)."""
    result = _answer(pipeline, '{"city": "Paris"}', structured_output=StructuredOutput("json_object"))
    assert result.text == '{"city": "Paris"}' and result.audio.size == 0
