"""The in-process pipeline against the model's own reference implementation (greedy, float64)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

from omnistream.engine.load_options import LoadOptions
from omnistream.pipeline import AudioEvent, GenerationRequest, Pipeline, collect
from omnistream.request.chunk_plan import SCHEDULES, ChunkPlan

PROMPTS = [
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello, how are you?"},
    ],
    [{"role": "user", "content": "Tell me a story about the sea."}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather like?"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "caf\u00e9 na\u00efve \u4f60\u597d, and tomorrow?"},
    ],
]
MAX_TOKENS = 24
MAX_FRAMES = 40
# The engine decodes in float64 here and ships float32: one float32 step is all rounding can leave.
AUDIO_ATOL = float(np.spacing(np.float32(1)))


@pytest.fixture(scope="module")
def pipeline(tiny_model_dir):
    with Pipeline(tiny_model_dir, LoadOptions(dtype="float64"), max_batch=8) as p:
        yield p


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """Tokens, talker codes and audio of `Qwen3OmniMoeForConditionalGeneration.generate` per prompt."""
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        tiny_model_dir, dtype=torch.float64, experts_implementation="eager"
    ).eval()
    captured: list[torch.Tensor] = []
    decode = model.code2wav.chunked_decode

    def capture(codes, *args, **kwargs):
        captured.append(codes.clone())
        return decode(codes, *args, **kwargs)

    model.code2wav.chunked_decode = capture
    return model, captured, {}


def _reference_run(reference, prompt_ids: list[int]):
    """The reference's output for a prompt, generated once (the chunk schedule is ours alone)."""
    model, captured, runs = reference
    if tuple(prompt_ids) in runs:
        return runs[tuple(prompt_ids)]
    captured.clear()
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        sequences, wav = model.generate(
            ids,
            return_audio=True,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_repetition_penalty=1.0,
            thinker_max_new_tokens=MAX_TOKENS,
            talker_max_new_tokens=MAX_FRAMES + 1,  # the reference drops its last codebook-0 step
            thinker_eos_token_id=model.config.im_end_token_id,
        )
    run = sequences[0, len(prompt_ids) :].tolist(), captured[0][0].numpy(), wav.reshape(-1).numpy()
    runs[tuple(prompt_ids)] = run
    return run


def _request(messages, mode="async", **kw) -> GenerationRequest:
    return GenerationRequest(
        messages=messages,
        max_tokens=MAX_TOKENS,
        max_audio_frames=MAX_FRAMES,
        initial_codec_chunk_frames=4,
        mode=mode,
        **kw,
    )


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_tokens_codes_and_audio_match_reference(pipeline, reference, index, schedule):
    result = asyncio.run(collect(pipeline, _request(PROMPTS[index], codec_chunk_schedule=schedule)))
    ref_tokens, ref_codes, ref_wav = _reference_run(reference, result.prompt_ids)
    assert result.output_ids == ref_tokens
    assert result.codes.shape[0] == 16 and result.codes.shape[1] > 0
    np.testing.assert_array_equal(result.codes, ref_codes)
    # A full Code2Wav decode of our codes is the reference audio (<= 300 frames: one chunk there).
    code2wav = pipeline.code2wav.code2wav
    with torch.no_grad():
        full = code2wav(torch.from_numpy(result.codes)[None]).reshape(-1).float().numpy()
    np.testing.assert_array_equal(full, ref_wav)
    # The streamed audio is that decode: exact streaming, not an approximation of it.
    assert result.audio.shape == full.shape
    np.testing.assert_allclose(result.audio, full, rtol=0, atol=AUDIO_ATOL)


def _full_decode(pipeline, codes: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return pipeline.code2wav.code2wav(torch.from_numpy(codes)[None]).reshape(-1).float().numpy()


def test_batched_requests_match_solo_runs(pipeline):
    async def run_all():
        return await asyncio.gather(*(collect(pipeline, _request(p)) for p in PROMPTS))

    solo = [asyncio.run(collect(pipeline, _request(p))) for p in PROMPTS]
    batched = asyncio.run(run_all())
    for a, b in zip(solo, batched, strict=True):
        assert a.output_ids == b.output_ids
        np.testing.assert_array_equal(a.codes, b.codes)
        np.testing.assert_allclose(b.audio, _full_decode(pipeline, b.codes), rtol=0, atol=AUDIO_ATOL)


def test_batching_actually_batches(pipeline):
    seen: list[int] = []
    listener = lambda engine, _: seen.append(engine.stats.last_batch_size)  # noqa: E731
    pipeline.talker.add_step_listener(listener)
    try:

        async def run_all():
            return await asyncio.gather(*(collect(pipeline, _request(p)) for p in PROMPTS))

        asyncio.run(run_all())
    finally:
        pipeline.talker._step_listeners.remove(listener)
    assert max(seen) >= 2


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_audio_chunks_are_the_plans_windows(pipeline, schedule):
    """The talker ships and code2wav decodes by the request's plan: one audio event per window."""
    request = _request(PROMPTS[1], ignore_eos=True, codec_chunk_schedule=schedule)

    async def sizes():
        return [e.audio.size async for e in pipeline.generate(request) if isinstance(e, AudioEvent)]

    got = asyncio.run(sizes())
    frames = (sum(got) + 555) // 1920
    windows = ChunkPlan(4, 25, 25, schedule).windows(frames)
    assert frames > 12  # long enough that the schedules differ (4, 8, ... against 4, 25)
    assert got == [windows[0] * 1920 - 555] + [n * 1920 for n in windows[1:]]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_sequential_and_async_modes_are_identical(pipeline, schedule):
    for messages in PROMPTS[:2]:
        a = asyncio.run(collect(pipeline, _request(messages, "async", codec_chunk_schedule=schedule)))
        s = asyncio.run(collect(pipeline, _request(messages, "sequential", codec_chunk_schedule=schedule)))
        assert a.output_ids == s.output_ids
        np.testing.assert_array_equal(a.codes, s.codes)
        np.testing.assert_array_equal(a.audio, s.audio)
        full = _full_decode(pipeline, a.codes)
        np.testing.assert_allclose(a.audio, full, rtol=0, atol=AUDIO_ATOL)
        np.testing.assert_allclose(s.audio, full, rtol=0, atol=AUDIO_ATOL)


def test_ignore_eos_runs_to_max_tokens(pipeline):
    result = asyncio.run(collect(pipeline, _request(PROMPTS[0], ignore_eos=True)))
    assert len(result.output_ids) == MAX_TOKENS
    assert result.done.finish_reason == "length"
