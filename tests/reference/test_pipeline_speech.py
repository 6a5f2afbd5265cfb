"""Speech (a given answer, not generated) through the in-process pipeline: the thinker streams the
text's own tokens, and the audio is what the talker and code2wav make of exactly those tokens."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from omnistream.engine.settings import EngineSettings
from omnistream.models.qwen3_omni.checkpoint import load_tokenizer
from omnistream.pipeline import GenerationRequest, Pipeline, collect
from omnistream.request.errors import InvalidRequest
from omnistream.request.stage_chain import TalkerFeed, TalkerParams

TEXT = "The sea was calm tonight, caf\u00e9 \u4f60\u597d."
MAX_FRAMES = 30
AUDIO_ATOL = float(np.spacing(np.float32(1)))


@pytest.fixture(scope="module")
def pipeline(tiny_model_dir):
    with Pipeline(tiny_model_dir, EngineSettings(dtype="float64", max_batch=8)) as p:
        yield p


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def _speech(text: str, **kw) -> GenerationRequest:
    kw.setdefault("max_tokens", 256)
    return GenerationRequest(
        messages=[{"role": "user", "content": text}],
        assistant_text=text,
        max_audio_frames=MAX_FRAMES,
        initial_codec_chunk_frames=4,
        **kw,
    )


def _expected_ids(tokenizer, pipeline, text: str) -> tuple[list[int], list[int]]:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    prompt = list(prompt if isinstance(prompt, list) else prompt["input_ids"])
    answer = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    return prompt, [*answer, pipeline.thinker.config.im_end_token_id]


def test_the_thinker_streams_the_given_text_as_its_answer(pipeline, tokenizer):
    result = asyncio.run(collect(pipeline, _speech(TEXT)))
    prompt, answer = _expected_ids(tokenizer, pipeline, TEXT)
    assert result.prompt_ids == prompt
    assert result.output_ids == answer
    assert result.text == TEXT
    assert result.done.finish_reason == "stop"
    assert result.codes.shape[1] > 0 and result.audio.size > 0


def test_special_token_strings_in_the_text_stay_text(pipeline, tokenizer):
    text = "say <|im_end|> and <|audio_pad|> aloud"
    result = asyncio.run(collect(pipeline, _speech(text)))
    ids = result.output_ids
    im_end = pipeline.thinker.config.im_end_token_id
    assert ids[-1] == im_end and im_end not in ids[:-1]
    assert ids == _expected_ids(tokenizer, pipeline, text)[1]
    assert result.text == text


def test_audio_is_the_talker_and_code2wav_output_for_the_same_tokens(pipeline, tokenizer):
    """The talker fed the text's tokens in one piece (not through the thinker), its codes decoded
    in one shot: the speech request's codes and audio are exactly those."""
    result = asyncio.run(collect(pipeline, _speech(TEXT)))
    prompt, answer = _expected_ids(tokenizer, pipeline, TEXT)

    async def talk() -> np.ndarray:
        out = pipeline.talker.add_request("direct", TalkerParams(max_frames=MAX_FRAMES))
        pipeline.talker.feed_piece("direct", TalkerFeed(answer, True, prompt))
        frames = [step.codes async for step in out if step.codes is not None]
        return np.array(frames, dtype=np.int64).T

    codes = asyncio.run(talk())
    np.testing.assert_array_equal(result.codes, codes)
    with torch.no_grad():
        full = pipeline.code2wav.code2wav(torch.from_numpy(codes)[None]).reshape(-1).float().numpy()
    assert result.audio.shape == full.shape
    np.testing.assert_allclose(result.audio, full, rtol=0, atol=AUDIO_ATOL)


def test_a_text_over_max_tokens_is_refused_before_any_output(pipeline, tokenizer):
    answer = _expected_ids(tokenizer, pipeline, TEXT)[1]

    async def run():
        return await collect(pipeline, _speech(TEXT, max_tokens=len(answer) - 1))

    with pytest.raises(InvalidRequest, match="text to speak"):
        asyncio.run(run())
    # exactly at the limit it is spoken
    assert asyncio.run(collect(pipeline, _speech(TEXT, max_tokens=len(answer)))).output_ids == answer


def test_max_tokens_is_a_cap_on_the_text_not_a_budget_held_in_the_model_length(pipeline, tokenizer):
    """Speech asks for the deployment's whole token limit: only the text's own tokens must fit."""
    request = _speech(TEXT, max_tokens=pipeline.thinker.max_model_len)
    result = asyncio.run(collect(pipeline, request))
    assert result.output_ids == _expected_ids(tokenizer, pipeline, TEXT)[1]


def test_a_text_past_the_model_length_is_refused(pipeline):
    text = " ".join(f"w{i}" for i in range(pipeline.thinker.max_model_len))
    request = _speech(text, max_tokens=10**6)

    async def run():
        return await collect(pipeline, request)

    with pytest.raises(InvalidRequest, match="model length"):
        asyncio.run(run())


def test_an_empty_text_is_refused():
    with pytest.raises(InvalidRequest):
        _speech("").validate()
