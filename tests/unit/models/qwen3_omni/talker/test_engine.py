"""Talker engine: waiting for rows without stalling others, abort, validation, the code predictor."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
import torch
from transformers import DynamicCache

from omnistream.engine.load_options import LoadOptions
from omnistream.engine.sampling import SamplingParams
from omnistream.engine.settings import TalkerEngineSettings, ThinkerEngineSettings, derive
from omnistream.models.qwen3_omni.talker.engine import TalkerEngine, TalkerParams
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine
from omnistream.request.errors import InternalError, InvalidRequest
from tests.unit.models.qwen3_omni.prefill_helpers import long_prompt, prefill_chunk


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    # No prefix cache: the prefills these tests watch compute every row (tests of it: test_prefix.py).
    talker = TalkerEngine(
        tiny_model_dir,
        TalkerEngineSettings(dtype="float32", max_batch=4, max_model_len=512, prefix_cache_gib=0),
    )
    thinker = ThinkerEngine(
        tiny_model_dir, ThinkerEngineSettings(dtype="float32", max_batch=1, max_model_len=256)
    )
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


STREAM = [5, 6, 7, 8, 9, 10, 11, 12]  # thinker tokens after the prompt


def _rows(talker, prompt) -> int:
    """How many prompt rows the talker prefills for `prompt`."""
    speaker = talker.speakers[talker.default_speaker]
    return talker.prompts.prompt(prompt, STREAM[:4], speaker, None).shape[1]


async def _codes(talker, rid, prompt, params) -> list[list[int]]:
    out = talker.add_request(rid, params)
    talker.feed(rid, STREAM, True, prompt_ids=prompt)
    return [step.codes for step in [s async for s in out] if step.codes is not None]


def test_a_chunked_prompt_gives_the_unchunked_codes(engines):
    """Chunk sizes 1, 7, rows-1 and rows: the same greedy and seeded-sampled codes, also with two
    prompts sharing each step's prefill budget and decoding next to each other."""
    talker, thinker = engines
    prompt = long_prompt(thinker)
    rows = _rows(talker, prompt)
    greedy = TalkerParams(max_frames=12)
    sampled = TalkerParams(max_frames=12, sampling=SamplingParams(temperature=0.9, top_k=50, seed=5))

    async def pair(tag: str):
        return await asyncio.gather(
            _codes(talker, f"g-{tag}", prompt, greedy), _codes(talker, f"s-{tag}", prompt, sampled)
        )

    with prefill_chunk(talker, rows):
        solo = [
            asyncio.run(_codes(talker, "g", prompt, greedy)),
            asyncio.run(_codes(talker, "s", prompt, sampled)),
        ]
    for chunk in (1, 7, rows - 1, rows):
        with prefill_chunk(talker, chunk):
            assert asyncio.run(pair(str(chunk))) == solo, chunk
    assert len(solo[0]) == 12 and solo[0] != solo[1]


def test_running_request_gets_frames_between_the_pieces_of_a_long_prefill(engines):
    """Each step prefills one piece of the long prompt and then runs the running request's frame,
    so it gets a frame between every two pieces (observed per step, not timed), and its codes are
    those of a solo run."""
    talker, thinker = engines
    chunk = 16
    short, long_ids = thinker.encode_chat([{"role": "user", "content": "hi"}]), long_prompt(thinker)
    rows = _rows(talker, long_ids)
    running_params = TalkerParams(max_frames=60)
    solo = asyncio.run(_codes(talker, "solo", short, running_params))
    steps: list[tuple[int, int]] = []  # per step after the long request came: (its prefilled, running frames)

    async def run():
        out = talker.add_request("running", running_params)
        talker.feed("running", STREAM, True, prompt_ids=short)
        codes = [(await out.get()).codes]
        running = talker.state("running")
        long_out = talker.add_request("long", TalkerParams(max_frames=1))
        long = talker.state("long")

        def listener(_engine, _seconds):
            steps.append((long.prefilled, running.frames))

        talker.add_step_listener(listener)
        try:
            talker.feed("long", STREAM, True, prompt_ids=long_ids)
            first = asyncio.ensure_future(long_out.get())
            async for step in out:
                if step.codes is not None:
                    codes.append(step.codes)
            await first
        finally:
            talker.remove_step_listener(listener)
        return codes

    with prefill_chunk(talker, chunk):
        codes = asyncio.run(run())
    assert codes == solo
    pieces = [(p, n) for i, (p, n) in enumerate(steps) if p != (steps[i - 1][0] if i else 0)]
    assert [p for p, _ in pieces] == [*range(chunk, rows, chunk), rows]
    counts = [n for _, n in pieces]
    assert all(b > a for a, b in itertools.pairwise(counts)), counts  # a frame per piece


def test_a_request_failing_in_its_prefill_fails_alone(tiny_model_dir, engines):
    """A piece of a chunked prefill that raises fails that request only: a running request and a
    request prefilling in the same steps keep their exact codes, and the failed piece left the KV
    length where the last good piece put it."""
    _, thinker = engines
    talker = TalkerEngine(
        tiny_model_dir,
        TalkerEngineSettings(
            dtype="float32", max_batch=4, max_model_len=512, prefill_chunk=8, prefix_cache_gib=0
        ),
    )
    prompt, short = long_prompt(thinker), thinker.encode_chat([{"role": "user", "content": "hi"}])
    params, running_params = TalkerParams(max_frames=10), TalkerParams(max_frames=40)
    talker.start()
    try:
        solo_short = asyncio.run(_codes(talker, "solo-short", short, running_params))
        solo_long = asyncio.run(_codes(talker, "solo-long", prompt, params))
        forward = talker.frames.talker_forward
        at_failure: list[tuple[int, int]] = []

        def faulty_forward(states, embeds, positions=None, **kwargs):
            state = states[0]
            if state.request_id == "poison" and state.prefilled >= 16:  # a later piece
                at_failure.append((state.prefilled, talker.cache.lengths[state.slot]))
                raise RuntimeError("injected fault")
            return forward(states, embeds, positions, **kwargs)

        talker.frames.talker_forward = faulty_forward

        async def together():
            async def run(rid, ids, p):
                try:
                    return await _codes(talker, rid, ids, p)
                except Exception as exc:
                    return exc

            return await asyncio.gather(
                run("running", short, running_params),
                run("poison", prompt, params),
                run("other", prompt, params),
            )

        running, poison, other = asyncio.run(together())
    finally:
        talker.stop()
    assert isinstance(poison, InternalError) and "injected fault" in str(poison)
    assert running == solo_short and other == solo_long
    # Failed once (alone, at once), with the KV length where its good pieces left it; how many
    # positions those held depends on what shared the budget with them.
    assert len(at_failure) == 1 and at_failure[0][0] == at_failure[0][1] >= 16
    assert talker.num_requests == 0 and talker.cache.free_slots == 4


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
    static = _talk(
        TalkerEngine(tiny_model_dir, derive(TalkerEngineSettings, options, max_batch=4, max_model_len=512)),
        prompt,
    )
    before = TalkerEngine(
        tiny_model_dir, derive(TalkerEngineSettings, options, max_batch=4, max_model_len=512)
    )
    before.frames.code_predictor = _DynamicCachePredictor(before.cp)  # what its frame steps run
    dynamic = _talk(before, prompt)
    assert [len(frames) for frames in static] == [len(frames) for frames in dynamic]
    assert sum(len(frames) for frames in static) > 4  # codes were produced, not only end markers
    assert static == dynamic
