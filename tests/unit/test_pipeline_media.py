"""Media prompts through the in-process pipeline against the model's reference (greedy, float64):
the reference gets the same decoded arrays through the same processor and runs
`Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True)`."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

from omnistream.load_options import LoadOptions
from omnistream.pipeline import GenerationRequest, Pipeline, collect
from omnistream.qwen3_omni.media_prompt import check_media, processor_inputs
from tests.media_samples import conversations

MAX_TOKENS = 12
MAX_FRAMES = 24
CASES = conversations()
TEXT_ONLY = [{"role": "user", "content": "Tell me a story about the sea."}]


@pytest.fixture(scope="module")
def pipeline(tiny_model_dir):
    # A small encode budget: media encode in several slices, interleaved with decode steps.
    with Pipeline(tiny_model_dir, LoadOptions(dtype="float64"), max_batch=8) as p:
        p.thinker.encode_budget = p.thinker.audio_window
        yield p


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        tiny_model_dir, dtype=torch.float64, experts_implementation="eager"
    ).eval()
    captured: list[torch.Tensor] = []
    decode = model.code2wav.chunked_decode

    def capture(codes, *args, **kwargs):
        captured.append(codes.clone())
        return decode(codes, *args, **kwargs)

    model.code2wav.chunked_decode = capture
    return model, captured


def reference_inputs(processor, messages, use_audio_in_video: bool) -> dict:
    """The processor call of the reference for decoded media (what `apply_chat_template` does
    after loading files)."""
    rendered = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    media = check_media(messages, use_audio_in_video)
    return dict(processor(**processor_inputs(rendered, media, use_audio_in_video)))


# transformers 5.24's reference talker cannot run prompts with both audio and vision: its
# `get_rope_index` reads `talker_config.audio_config`, which does not exist (AttributeError). For
# those the reference is the thinker's `generate` (tokens); codes have no reference.
TALKER_REFERENCE = {"audio", "image", "video_no_sound"}


def reference_run(reference, inputs: dict, use_audio_in_video: bool, with_codes: bool = True):
    model, captured = reference
    captured.clear()
    prompt_len = inputs["input_ids"].shape[1]
    if not with_codes:
        with torch.no_grad():
            sequences = model.thinker.generate(
                **inputs,
                use_audio_in_video=use_audio_in_video,
                do_sample=False,
                max_new_tokens=MAX_TOKENS,
                eos_token_id=model.config.im_end_token_id,
            )
        return sequences[0, prompt_len:].tolist(), None
    with torch.no_grad():
        sequences, _ = model.generate(
            **inputs,
            use_audio_in_video=use_audio_in_video,
            return_audio=True,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_repetition_penalty=1.0,
            thinker_max_new_tokens=MAX_TOKENS,
            talker_max_new_tokens=MAX_FRAMES + 1,  # the reference drops its last codebook-0 step
            thinker_eos_token_id=model.config.im_end_token_id,
        )
    return sequences[0, prompt_len:].tolist(), captured[0][0].numpy()


def _request(messages, use_audio_in_video=False) -> GenerationRequest:
    return GenerationRequest(
        messages=messages,
        max_tokens=MAX_TOKENS,
        max_audio_frames=MAX_FRAMES,
        initial_codec_chunk_frames=4,
        use_audio_in_video=use_audio_in_video,
    )


@pytest.fixture(scope="module")
def expected(pipeline, reference):
    out = {}
    for name, (messages, aiv) in CASES.items():
        inputs = reference_inputs(pipeline.thinker.processor, messages, aiv)
        tokens, codes = reference_run(reference, inputs, aiv, with_codes=name in TALKER_REFERENCE)
        out[name] = (inputs["input_ids"][0].tolist(), tokens, codes)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_media_prompt_matches_reference(pipeline, expected, name):
    messages, aiv = CASES[name]
    result = asyncio.run(collect(pipeline, _request(messages, aiv)))
    prompt_ids, tokens, codes = expected[name]
    assert result.prompt_ids == prompt_ids
    assert result.output_ids == tokens
    assert result.codes.shape[1] > 0
    if codes is not None:
        np.testing.assert_array_equal(result.codes, codes)


def test_media_batched_with_text_matches_reference(pipeline, expected):
    names = list(CASES)

    async def run_all():
        requests = [_request(*CASES[n]) for n in names] + [_request(TEXT_ONLY)] * 2
        return await asyncio.gather(*(collect(pipeline, r) for r in requests))

    results = asyncio.run(run_all())
    for name, result in zip(names, results, strict=False):
        _, tokens, codes = expected[name]
        assert result.output_ids == tokens, name
        if codes is not None:
            np.testing.assert_array_equal(result.codes, codes, err_msg=name)
    solo_text = asyncio.run(collect(pipeline, _request(TEXT_ONLY)))
    for result in results[len(names) :]:
        assert result.output_ids == solo_text.output_ids
        np.testing.assert_array_equal(result.codes, solo_text.codes)
