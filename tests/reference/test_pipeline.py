"""The in-process pipeline against the model's own reference implementation (greedy, float64)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from omnistream.engine.settings import EngineSettings
from omnistream.pipeline import AudioEvent, GenerationRequest, Pipeline, collect
from omnistream.request.chunk_plan import SCHEDULES, ChunkPlan
from tests.reference_runs import CASES, ReferenceRun, runs_for

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
    with Pipeline(tiny_model_dir, EngineSettings(dtype="float64", max_batch=8)) as p:
        yield p


def _request(messages, mode="async", **kw) -> GenerationRequest:
    return GenerationRequest(
        messages=messages,
        max_tokens=MAX_TOKENS,
        max_audio_frames=MAX_FRAMES,
        initial_codec_chunk_frames=4,
        mode=mode,
        **kw,
    )


# --- against the reference, on every build (tests/reference_runs.py) ------------------------------
# Two builds in `make test`: the never-ending one and the ending one `make run` serves; the second
# seed and size and the real-shaped build in `make test-slow`.
BUILD_PARAMS = [
    "never-ending",
    "ending",
    pytest.param("seed7-h96", marks=pytest.mark.slow),
    pytest.param("real-shaped", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=BUILD_PARAMS)
def build(request, build_dirs, references):
    """(name, pipeline, reference) of one build; one pipeline at a time."""
    name = request.param
    with Pipeline(build_dirs(name), EngineSettings(dtype="float64", max_batch=8)) as p:
        yield name, p, references(name)


def _assert_matches(pipeline, result, ref: ReferenceRun, label) -> None:
    assert result.output_ids == ref.tokens, label
    assert result.codes.shape[0] == 16 and result.codes.shape[1] > 0, label
    np.testing.assert_array_equal(result.codes, ref.codes, err_msg=str(label))
    # A full Code2Wav decode of our codes is the reference audio (<= 300 frames: one chunk there).
    full = _full_decode(pipeline, result.codes)
    np.testing.assert_array_equal(full, ref.wav, err_msg=str(label))
    # The streamed audio is that decode: exact streaming, not an approximation of it.
    assert result.audio.shape == full.shape, label
    np.testing.assert_allclose(result.audio, full, rtol=0, atol=AUDIO_ATOL, err_msg=str(label))


@pytest.mark.parametrize("case", list(CASES))
def test_tokens_codes_and_audio_match_reference(build, case):
    """Alone, async and sequential, both chunk schedules: the reference's tokens, codes and audio,
    however the answer ends (the cases: tests/reference_runs.py)."""
    name, pipeline, reference = build
    for mode, schedule in runs_for(name, case):
        result = asyncio.run(collect(pipeline, CASES[case].request(mode, schedule)))
        ref = reference.run(result.prompt_ids, CASES[case])
        _assert_matches(pipeline, result, ref, (name, case, mode, schedule))


@pytest.mark.parametrize("mode", ["async", "sequential"])
def test_batched_requests_match_reference(build, mode):
    """Every case at once (rows ending at different frames, by different ends): each its reference."""
    name, pipeline, reference = build
    cases = list(CASES.values())

    async def run_all():
        return await asyncio.gather(*(collect(pipeline, c.request(mode)) for c in cases))

    for case, result in zip(CASES, asyncio.run(run_all()), strict=True):
        _assert_matches(pipeline, result, reference.run(result.prompt_ids, CASES[case]), (name, case, mode))


def test_the_cases_end_every_way(build):
    """The reference runs end as the builds promise, so each way of ending is compared: on the
    ending builds by the thinker's end token and by max_tokens, by the talker's end code and by
    max_audio_frames; on the never-ending build always at the limits."""
    name, pipeline, reference = build
    im_end = pipeline.thinker.config.im_end_token_id
    thinker_ends, talker_ends = set(), set()
    for case in CASES.values():
        ref = reference.run(pipeline.thinker.encode_chat(case.messages), case)
        thinker_ends.add("stop" if ref.tokens[-1] == im_end else "length")
        assert len(ref.tokens) <= case.max_tokens and ref.frames <= case.max_frames
        talker_ends.add("length" if ref.frames == case.max_frames else "stop")
    if name == "never-ending":
        assert thinker_ends == talker_ends == {"length"}
    else:
        assert thinker_ends == talker_ends == {"stop", "length"}, name


def _full_decode(pipeline, codes: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return pipeline.code2wav.code2wav(torch.from_numpy(codes)[None]).reshape(-1).float().numpy()


def test_batching_actually_batches(pipeline):
    seen: list[int] = []
    listener = lambda engine, _: seen.append(engine.stats.last_batch_size)  # noqa: E731
    pipeline.talker.add_step_listener(listener)
    try:

        async def run_all():
            return await asyncio.gather(*(collect(pipeline, _request(p)) for p in PROMPTS))

        asyncio.run(run_all())
    finally:
        pipeline.talker.remove_step_listener(listener)
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


def test_ignore_eos_runs_to_max_tokens(pipeline):
    result = asyncio.run(collect(pipeline, _request(PROMPTS[0], ignore_eos=True)))
    assert len(result.output_ids) == MAX_TOKENS
    assert result.done.finish_reason == "length"


def test_leaving_mid_answer_frees_the_request_in_every_engine(pipeline):
    """A consumer that stops reading (closes the stream) ends the request in all three engines: the
    chain closes its links before the stream's close returns."""

    async def leave_after_first_audio() -> None:
        stream = pipeline.generate(_request(PROMPTS[0], ignore_eos=True), "leaver")
        async for event in stream:
            if isinstance(event, AudioEvent):
                break
        await stream.aclose()

    asyncio.run(leave_after_first_audio())
    assert not any(engine.has_request("leaver") for engine in pipeline.engines)
