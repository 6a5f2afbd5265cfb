"""Talker engine: waiting for rows without stalling others, abort, validation."""

from __future__ import annotations

import asyncio
import time

import pytest

from omnistream.errors import InvalidRequest
from omnistream.load_options import LoadOptions
from services.talker.engine import TalkerEngine, TalkerParams
from services.thinker.engine import ThinkerEngine


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    talker = TalkerEngine(tiny_model_dir, LoadOptions(dtype="float32"), max_batch=4, max_model_len=512)
    thinker = ThinkerEngine(tiny_model_dir, LoadOptions(dtype="float32"), max_batch=1, max_model_len=256)
    talker.start()
    yield talker, thinker
    talker.stop()


def test_request_waiting_for_text_does_not_stall_others(engines):
    talker, thinker = engines
    prompt = thinker.encode_chat([{"role": "user", "content": "hello"}])

    async def run():
        starved = talker.add_request("starved", TalkerParams(max_frames=200))
        talker.feed("starved", [5], last=False, prompt_ids=prompt)  # one token: frame 0 only
        fed = talker.add_request("fed", TalkerParams(max_frames=30))
        talker.feed("fed", [5, 6, 7, 8], last=True, prompt_ids=prompt)
        frames = [s async for s in fed]
        first = await starved.get()
        assert talker.has_request("starved")
        talker.abort("starved")
        return frames, first

    frames, first = asyncio.run(run())
    assert len(frames) == 30 and frames[-1].finished
    assert first.frame == 0 and len(first.codes) == 16
    assert talker.num_requests == 0
    # The KV slots come back on the engine thread before its next step.
    deadline = time.monotonic() + 2
    while talker.cache.free_slots != 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert talker.cache.free_slots == 4


def test_unknown_speaker_and_bad_input(engines):
    talker, _ = engines

    async def run():
        with pytest.raises(InvalidRequest) as err:
            talker.add_request("x", TalkerParams(speaker="nobody"))
        assert err.value.field == "speaker"
        talker.add_request("y", TalkerParams(max_frames=100))
        with pytest.raises(InvalidRequest, match="prompt ids"):
            talker.feed("y", [1], last=False)
        with pytest.raises(InvalidRequest, match="assistant"):
            talker.feed("y", [1], last=False, prompt_ids=[1, 2, 3])
        talker.abort("y")

    asyncio.run(run())
    assert talker.num_requests == 0
