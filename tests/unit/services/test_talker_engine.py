"""Talker engine: waiting for rows without stalling others, abort, validation, the code predictor."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from transformers import DynamicCache

from omnistream.errors import InvalidRequest
from omnistream.load_options import LoadOptions
from omnistream.sampling import SamplingParams
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


class _DynamicCachePredictor:
    """The code predictor's forward as the engine ran it before the static cache: one fresh
    DynamicCache per frame, grown by the model itself."""

    def __init__(self, cp) -> None:
        self.cp = cp
        self.cache: DynamicCache | None = None

    def run(self, group: int, embeds: torch.Tensor) -> torch.Tensor:
        if group == 0:
            self.cache = DynamicCache(config=self.cp.config)
        out = self.cp.model(inputs_embeds=embeds, cache=self.cache, use_cache=True)
        return self.cp.lm_head[group](out.last_hidden_state[:, -1])


def _talk(talker: TalkerEngine, prompt: list[int]) -> list[list[list[int]]]:
    """Three seeded, sampled requests with all their input given before the engine starts, so every
    run batches them the same way; returns each request's frames."""
    sampling = [SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=seed) for seed in (1, 2, 3)]
    sampling.append(SamplingParams())  # and one greedy request in the same batches

    async def run():
        outputs = []
        for i, params in enumerate(sampling):
            outputs.append(talker.add_request(f"r{i}", TalkerParams(max_frames=12, sampling=params)))
            talker.feed(f"r{i}", [5 + i, 6, 7, 8, 9], last=True, prompt_ids=prompt)
        talker.start()
        return [[item.codes async for item in out if item.codes is not None] for out in outputs]

    try:
        return asyncio.run(run())
    finally:
        talker.stop()


def test_static_code_predictor_gives_the_dynamic_cache_codes(engines, tiny_model_dir):
    _, thinker = engines
    prompt = thinker.encode_chat([{"role": "user", "content": "hello"}])
    options = LoadOptions(dtype="float32")
    static = _talk(TalkerEngine(tiny_model_dir, options, max_batch=4, max_model_len=512), prompt)
    before = TalkerEngine(tiny_model_dir, options, max_batch=4, max_model_len=512)
    before.code_predictor = _DynamicCachePredictor(before.cp)
    dynamic = _talk(before, prompt)
    assert [len(frames) for frames in static] == [len(frames) for frames in dynamic]
    assert sum(len(frames) for frames in static) > 4  # codes were produced, not only end markers
    assert static == dynamic
