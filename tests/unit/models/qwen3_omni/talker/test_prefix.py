"""The talker's prefix caching (talker/prefix.py): a prompt starting with an earlier prompt's user
rows prefills only the rest, for any speaker; rows of other content are never a hit; a prefill that
fails or is aborted stores nothing; every code is the cache-off engine's."""

from __future__ import annotations

import asyncio

import pytest
import torch

from omnistream.engine.load_options import LoadOptions
from omnistream.engine.settings import TalkerEngineSettings, ThinkerEngineSettings, derive
from omnistream.models.qwen3_omni.talker.engine import TalkerEngine, TalkerParams
from omnistream.models.qwen3_omni.talker.prompt import user_positions
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine
from omnistream.request.errors import InternalError

STREAM = [5, 6, 7, 8, 9, 10, 11, 12]  # thinker tokens after the prompt
F64 = LoadOptions(dtype="float64")


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    on = TalkerEngine(
        tiny_model_dir, derive(TalkerEngineSettings, F64, max_batch=2, max_model_len=512, prefill_chunk=16)
    )
    off = TalkerEngine(
        tiny_model_dir, derive(TalkerEngineSettings, F64, max_batch=2, max_model_len=512, prefix_cache_gib=0)
    )
    chat = ThinkerEngine(tiny_model_dir, derive(ThinkerEngineSettings, F64, max_batch=1, max_model_len=256))
    on.start()
    off.start()
    yield on, off, chat
    on.stop()
    off.stop()


def _turns(chat, count: int) -> list[list[int]]:
    messages, prompts = [], []
    for i in range(count):
        messages.append({"role": "user", "content": f"Question {i}: what do the ships carry over the sea?"})
        prompts.append(chat.encode_chat(messages))
        messages.append({"role": "assistant", "content": f"Answer {i}."})
    return prompts


def _user_rows(engine, prompt) -> int:
    cfg = engine.config
    return len(user_positions(prompt, cfg.im_start_token_id, cfg.user_token_id))


async def _codes(engine, rid, prompt, speaker=None, hidden=None) -> list[list[int]]:
    params = TalkerParams(max_frames=10, **({"speaker": speaker} if speaker else {}))
    out = engine.add_request(rid, params)
    engine.feed(rid, STREAM, True, prompt_ids=prompt, multimodal_hidden=hidden)
    return [step.codes for step in [s async for s in out] if step.codes is not None]


def _run(engine, rid, prompt, **kw) -> list[list[int]]:
    return asyncio.run(_codes(engine, rid, prompt, **kw))


def test_a_next_turn_prefills_only_its_new_rows_for_any_speaker(engines):
    on, off, chat = engines
    on.prefix_cache.clear()
    first, second = _turns(chat, 2)
    assert _run(on, "t1", first) == _run(off, "t1-off", first)
    assert on.prefix_cache.positions == _user_rows(on, first)  # the user rows, not the assistant's
    other = next(s for s in on.speakers if s != on.default_speaker)
    hits = on.prefix_cache.stats.hits
    assert _run(on, "t2", second, speaker=other) == _run(off, "t2-off", second, speaker=other)
    assert on.prefix_cache.stats.hits - hits == _user_rows(on, first)  # the speaker is no part of them


def _audio_prompt(chat) -> list[int]:
    audio = chat.config.thinker_config.audio_token_id
    text = chat.encode_chat([{"role": "user", "content": "Hear this sound, please."}])
    at = text.index(chat.config.user_token_id) + 2  # after "<|im_start|>user\n"
    return text[:at] + [audio] * 6 + text[at:]


def test_other_deep_rows_at_the_same_positions_are_never_a_hit(engines):
    on, off, chat = engines
    on.prefix_cache.clear()
    prompt = _audio_prompt(chat)
    audio = chat.config.thinker_config.audio_token_id
    positions = [p for p, t in enumerate(prompt) if t == audio]
    generator = torch.Generator().manual_seed(0)

    def rows():
        return {p: torch.randn(on.hidden_width, generator=generator, dtype=torch.float64) for p in positions}

    a, b = rows(), rows()
    _run(on, "a", prompt, hidden=a)
    hits = on.prefix_cache.stats.hits
    assert _run(on, "b", prompt, hidden=b) == _run(off, "b-off", prompt, hidden=b)
    assert on.prefix_cache.stats.hits - hits <= positions[0]  # at most the rows before the audio
    hits = on.prefix_cache.stats.hits
    assert _run(on, "a-again", prompt, hidden=a) == _run(off, "a-off", prompt, hidden=a)
    assert on.prefix_cache.stats.hits - hits == _user_rows(on, prompt)


def test_a_failed_or_aborted_prefill_stores_nothing_and_the_next_one_computes_all(engines):
    on, off, chat = engines
    on.prefix_cache.clear()
    prompt = _turns(chat, 3)[-1]
    forward = on.frames.talker_forward

    def faulty(states, embeds, positions=None, **kwargs):
        if states[0].request_id == "poison" and states[0].prefilled >= 16:  # its second piece
            raise RuntimeError("injected fault")
        return forward(states, embeds, positions, **kwargs)

    on.frames.talker_forward = faulty
    try:
        with pytest.raises(InternalError, match="injected fault"):
            _run(on, "poison", prompt)
    finally:
        on.frames.talker_forward = forward

    async def abort_in_prefill():
        on.prefill_chunk = 1  # a piece a step: the abort lands mid-prefill
        try:
            on.add_request("aborted", TalkerParams(max_frames=10))
            on.feed("aborted", STREAM, True, prompt_ids=prompt)
            while on.state("aborted").prefilled < 4:
                await asyncio.sleep(0.001)
            on.abort("aborted")
        finally:
            on.prefill_chunk = 16

    asyncio.run(abort_in_prefill())
    assert len(on.prefix_cache) == 0
    hits = on.prefix_cache.stats.hits
    assert _run(on, "after", prompt) == _run(off, "after-off", prompt)
    assert on.prefix_cache.stats.hits == hits


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_a_scope_is_found_by_its_own_requests_only_and_gone_once_released(engines):
    on, off, chat = engines
    on.prefix_cache.clear()
    prompt = _turns(chat, 2)[-1]
    expected = _run(off, "scope-off", prompt)

    def run(rid: str, scope: bytes) -> int:
        hits = on.prefix_cache.stats.hits

        async def codes():
            out = on.add_request(rid, TalkerParams(max_frames=10, cache_scope=scope))
            on.feed(rid, STREAM, True, prompt_ids=prompt)
            return [s.codes async for s in out if s.codes is not None]

        assert asyncio.run(codes()) == expected
        return on.prefix_cache.stats.hits - hits

    assert run("alice-1", b"alice") == 0
    assert run("bob-1", b"bob") == 0 and run("shared-1", b"") == 0  # same rows, other scopes
    assert run("alice-2", b"alice") == _user_rows(on, prompt)
    held = len(on.prefix_cache)
    on.release_cache_scope(b"alice")  # applied by the engine thread before its next step
    assert _wait_for(lambda: len(on.prefix_cache) < held)
    assert run("alice-3", b"alice") == 0
    assert run("bob-2", b"bob") == _user_rows(on, prompt)


def test_a_hit_builds_only_the_rows_after_it_and_they_are_the_whole_builds(engines):
    """A long conversation's user rows are mostly cached: the talker projects only the new ones
    (at twenty spoken turns all of them took milliseconds a turn), each row is the same (to float64
    rounding) whether the prompt is built whole or from a cached row on, and so are the codes."""
    on, off, chat = engines
    on.prefix_cache.clear()
    prompt = _audio_prompt(chat)
    audio = chat.config.thinker_config.audio_token_id
    hidden = {
        p: torch.randn(on.hidden_width, dtype=torch.float64) for p, t in enumerate(prompt) if t == audio
    }
    head = STREAM[:4]
    cfg = on.config
    users = user_positions(prompt, cfg.im_start_token_id, cfg.user_token_id)
    speaker = on.speakers[on.default_speaker.lower()]
    whole = on.prompts.prompt(prompt, head, speaker, hidden)
    for start in (1, len(users) // 2, len(users)):
        rows = on.prompts.prompt(prompt, head, speaker, hidden, users=users, start=start)
        # To float64 rounding, not bit for bit: on some CPUs (an AMD EPYC here) the GEMM rounds the
        # last rows of a matrix whose row count is not a multiple of 4 differently (1-2 ulp); the
        # codes, below, are the same with and without the cache.
        torch.testing.assert_close(rows, whole[:, start:], rtol=1e-13, atol=1e-16)

    built: list[int] = []
    text_rows = on.prompts.text_rows
    on.prompts.text_rows = lambda ids: built.append(len(ids)) or text_rows(ids)
    try:
        _run(on, "whole", prompt, hidden=hidden)
        assert built == [len(users), 4]  # the user rows, then the assistant head's
        built.clear()
        assert _run(on, "again", prompt, hidden=hidden) == _run(off, "again-off", prompt, hidden=hidden)
        assert built == [4]  # every user row came from the cache: none was built
    finally:
        on.prompts.text_rows = text_rows
