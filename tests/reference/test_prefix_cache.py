"""Prefix caching in both engines (thinker/prefix.py, talker/prefix.py) leaves every output as it is:
a conversation's turns, alone and batched, with text, audio and image turns, a prompt that shares
only part of a cached one and a prefix evicted mid-way give the tokens, codes and audio of the
transformers reference (text) and of the cache-off pipeline (media), greedy, float64, on every
build; and each later turn does find its earlier turns in both stages."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnistream.engine.load_options import LoadOptions
from omnistream.engine.settings import EngineSettings, PrefixCacheSettings, derive
from omnistream.models.qwen3_omni.talker.prompt import user_positions
from omnistream.pipeline import GenerationRequest, Pipeline, collect
from tests.media_samples import image, tone
from tests.reference_runs import Case

BUILD_PARAMS = [
    "never-ending",
    "ending",
    pytest.param("seed7-h96", marks=pytest.mark.slow),
    pytest.param("real-shaped", marks=pytest.mark.slow),
]
MAX_TOKENS = 12
MAX_FRAMES = 16
QUESTIONS = [
    "Tell me about the sea, the sky and the hills.",
    "And what of the rivers that run to it?",
    "Which of them is the longest, and why?",
    "Say it once more, slowly.",
]


@pytest.fixture(scope="module", params=BUILD_PARAMS)
def build(request, build_dirs, references):
    """(name, cache-on pipeline, cache-off pipeline, reference) of one build."""
    directory = build_dirs(request.param)
    options = LoadOptions(dtype="float64")
    with (
        Pipeline(directory, derive(EngineSettings, options, max_batch=4)) as on,
        Pipeline(directory, derive(PrefixCacheSettings, options, max_batch=4, prefix_cache_gib=0)) as off,
    ):
        on.thinker.prefill_chunk = on.talker.prefill_chunk = 32  # prompts prefill in several pieces
        yield request.param, on, off, references(request.param)


def _request(messages) -> GenerationRequest:
    return GenerationRequest(
        messages=messages, max_tokens=MAX_TOKENS, max_audio_frames=MAX_FRAMES, initial_codec_chunk_frames=4
    )


def _turns(questions, answers=None):
    """Each turn's messages: every question so far, each earlier one with its answer."""
    messages, turns = [], []
    for i, question in enumerate(questions):
        messages.append({"role": "user", "content": question})
        turns.append(list(messages))
        answer = answers[i] if answers else f"Answer number {i} is about the sea."
        messages.append({"role": "assistant", "content": answer})
    return turns


def _user_rows(pipeline, prompt_ids) -> int:
    cfg = pipeline.talker.config
    return len(user_positions(prompt_ids, cfg.im_start_token_id, cfg.user_token_id))


def _same(a, b, label) -> None:
    assert a.output_ids == b.output_ids, label
    np.testing.assert_array_equal(a.codes, b.codes, err_msg=str(label))
    np.testing.assert_array_equal(a.audio, b.audio, err_msg=str(label))


def _hits(pipeline) -> tuple[int, int]:
    return pipeline.thinker.prefix_cache.stats.hits, pipeline.talker.prefix_cache.stats.hits


def _clear(pipeline) -> None:
    pipeline.thinker.prefix_cache.clear()
    pipeline.talker.prefix_cache.clear()


def test_each_turn_reuses_the_last_in_both_stages_and_is_the_reference(build):
    name, on, off, reference = build
    _clear(on)
    previous = None
    for turn, messages in enumerate(_turns(QUESTIONS)):
        before = _hits(on)
        result = asyncio.run(collect(on, _request(messages)))
        ref = reference.run(result.prompt_ids, Case(messages, MAX_TOKENS, MAX_FRAMES))
        assert result.output_ids == ref.tokens, (name, turn)
        np.testing.assert_array_equal(result.codes, ref.codes, err_msg=f"{name} turn {turn}")
        np.testing.assert_array_equal(result.audio, ref.wav, err_msg=f"{name} turn {turn}")
        thinker, talker = (after - b for after, b in zip(_hits(on), before, strict=True))
        if previous is None:
            assert (thinker, talker) == (0, 0)
        else:
            # The thinker: at least the last turn's prompt (block-aligned); the talker: every user
            # row of the last turn, its partial last block included.
            assert thinker >= len(previous.prompt_ids) // 16 * 16, (name, turn)
            assert talker == _user_rows(on, previous.prompt_ids), (name, turn)
        previous = result
    assert _hits(off) == (0, 0) and len(off.talker.prefix_cache) == 0


def test_spoken_and_shown_turns_are_found_again_and_match_the_cache_off(build):
    name, on, off, _ = build
    _clear(on)
    first = {
        "role": "user",
        "content": [{"type": "audio", "audio": tone(1.3)}, {"type": "text", "text": "Hear it?"}],
    }
    second = {
        "role": "user",
        "content": [{"type": "image", "image": image()}, {"type": "text", "text": "And this?"}],
    }
    said = [first, {"role": "assistant", "content": "A tone."}, second]
    last = [{"role": "assistant", "content": "A picture."}, {"role": "user", "content": "Which came first?"}]
    turns = [[first], said, [*said, *last]]
    previous = None
    for turn, messages in enumerate(turns):
        before = _hits(on)
        result = asyncio.run(collect(on, _request(messages)))
        _same(result, asyncio.run(collect(off, _request(messages))), (name, turn))
        if previous is not None:
            # The talker's rows at the audio and image positions are the thinker's deep rows: the
            # thinker's cache hands back the same ones, so the talker finds its whole last prompt.
            assert _hits(on)[1] - before[1] == _user_rows(on, previous.prompt_ids), (name, turn)
        previous = result


def test_batched_turns_and_a_prompt_sharing_part_of_a_cached_one_match(build):
    name, on, off, reference = build
    _clear(on)
    one = _turns(QUESTIONS[:2])
    two = _turns(["Tell me about the mountains and the snow on them.", "Is it cold there?"])

    async def both(pipeline, turn):
        return await asyncio.gather(*(collect(pipeline, _request(c[turn])) for c in (one, two)))

    for turn in range(2):  # two conversations at once: turn 1 of both, then turn 2 of both
        for result, messages in zip(asyncio.run(both(on, turn)), (one[turn], two[turn]), strict=True):
            ref = reference.run(result.prompt_ids, Case(messages, MAX_TOKENS, MAX_FRAMES))
            assert result.output_ids == ref.tokens, (name, turn)
            np.testing.assert_array_equal(result.codes, ref.codes, err_msg=f"{name} batched turn {turn}")
    # Only the first question in common with conversation `one`, then another one.
    part = [
        one[1][0],
        {"role": "assistant", "content": "Something else was said."},
        {"role": "user", "content": "Why?"},
    ]
    before = _hits(on)
    result = asyncio.run(collect(on, _request(part)))
    _same(result, asyncio.run(collect(off, _request(part))), (name, "part"))
    thinker, talker = (after - b for after, b in zip(_hits(on), before, strict=True))
    assert 0 < thinker < len(result.prompt_ids) and 0 < talker < _user_rows(on, result.prompt_ids)


def test_a_prefix_evicted_midway_reuses_what_is_left_and_still_matches(build):
    name, on, off, _ = build
    _clear(on)
    turns = _turns(QUESTIONS[:3])
    for messages in turns[:2]:
        asyncio.run(collect(on, _request(messages)))
    # Keep one block: the first of the last chain (eviction takes chains from their tails).
    budgets = {}
    for engine in (on.thinker, on.talker):
        cache = engine.prefix_cache
        budgets[engine] = cache.budget_bytes
        per_block = max(block.nbytes for block in cache._blocks.values())
        cache.resize(per_block)
    try:
        before = _hits(on)
        result = asyncio.run(collect(on, _request(turns[2])))
        _same(result, asyncio.run(collect(off, _request(turns[2]))), (name, "evicted"))
        thinker, talker = (after - b for after, b in zip(_hits(on), before, strict=True))
        assert (
            0 < thinker < len(result.prompt_ids) // 2 and 0 < talker < _user_rows(on, result.prompt_ids) // 2
        )
    finally:
        for engine, budget in budgets.items():
            engine.prefix_cache.resize(budget)
