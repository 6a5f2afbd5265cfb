"""Thinker engine: sampling knobs, abort, validation."""

from __future__ import annotations

import asyncio
import time

import pytest

from omnistream.errors import InvalidRequest, Overloaded
from omnistream.load_options import LoadOptions
from omnistream.sampling import SamplingParams
from services.thinker.engine import ThinkerEngine, ThinkerParams


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = ThinkerEngine(
        tiny_model_dir, LoadOptions(dtype="float32"), max_batch=4, max_model_len=256, max_requests=6
    )
    e.start()
    yield e
    e.stop()


def _prompt(engine) -> list[int]:
    return engine.encode_chat([{"role": "user", "content": "Tell me about the sea."}])


async def _run(engine, rid, params) -> list[int]:
    out = engine.add_request(rid, _prompt(engine), params)
    return [t for step in [s async for s in out] for t in step.token_ids]


def test_seeded_sampling_is_reproducible_alone_and_batched(engine):
    sampled = ThinkerParams(20, True, SamplingParams(temperature=1.2, top_p=0.9, top_k=40, seed=1234))
    alone = asyncio.run(_run(engine, "a", sampled))

    async def batched():
        other = ThinkerParams(20, True, SamplingParams(temperature=1.0, seed=9))
        return await asyncio.gather(
            _run(engine, "b", sampled), _run(engine, "c", other), _run(engine, "d", other)
        )

    together = asyncio.run(batched())
    assert together[0] == alone
    assert len(alone) == 20
    greedy = asyncio.run(_run(engine, "e", ThinkerParams(20, True)))
    assert greedy != alone  # sampling at temperature 1.2 really samples


def test_abort_frees_state_at_once(engine):
    async def run():
        out = engine.add_request("abort-me", _prompt(engine), ThinkerParams(200, True))
        await out.get()
        assert engine.num_requests == 1
        assert engine.abort("abort-me")
        assert engine.num_requests == 0
        rest = [s async for s in out]
        return rest

    rest = asyncio.run(run())
    assert len(rest) < 200

    # Its KV slot comes back: a full batch still fits afterwards.
    async def fill():
        return await asyncio.gather(*(_run(engine, f"f{i}", ThinkerParams(3, True)) for i in range(4)))

    assert all(len(r) == 3 for r in asyncio.run(fill()))
    deadline = time.monotonic() + 2  # slots come back on the engine thread before its next step
    while engine.cache.free_slots != 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.cache.free_slots == 4


def test_validation_errors_name_the_field(engine):
    async def run():
        with pytest.raises(InvalidRequest) as err:
            engine.add_request("v1", [], ThinkerParams())
        assert err.value.field == "prompt"
        with pytest.raises(InvalidRequest) as err:
            engine.add_request("v2", [1, 99999], ThinkerParams())
        assert err.value.field == "prompt_ids"
        with pytest.raises(InvalidRequest) as err:
            engine.add_request("v3", [1, 2], ThinkerParams(max_tokens=10_000))
        assert err.value.field == "max_tokens"
        with pytest.raises(InvalidRequest) as err:
            engine.add_request("v4", [1, 2], ThinkerParams(5, sampling=SamplingParams(top_p=0)))
        assert err.value.field == "top_p"

    asyncio.run(run())
    assert engine.num_requests == 0


def test_admission_bound(engine):
    async def run():
        outs = [engine.add_request(f"o{i}", [1, 2, 3], ThinkerParams(50, True)) for i in range(6)]
        with pytest.raises(Overloaded):
            engine.add_request("o6", [1, 2, 3], ThinkerParams(5, True))
        for i in range(6):
            engine.abort(f"o{i}")
        return outs

    asyncio.run(run())
    assert engine.num_requests == 0


def test_a_step_failing_in_a_batch_fails_only_the_request_that_causes_it(tiny_model_dir):
    """The backstop behind validation: a batched forward that raises is retried request by request,
    and only the one that fails alone is failed; the others keep their exact greedy output."""
    engine = ThinkerEngine(tiny_model_dir, LoadOptions(dtype="float32"), max_batch=8, max_model_len=256)
    params = ThinkerParams(12, True)
    prompt = _prompt(engine)
    engine.start()
    try:
        solo = asyncio.run(_run(engine, "solo", params))
        forward = engine._forward
        batch_sizes_failed: list[int] = []

        def faulty_forward(states, ids):
            # Decode steps only: the prefill succeeds, then the request poisons every batch it joins.
            if ids.shape[1] == 1 and any(s.request_id == "poison" for s in states):
                batch_sizes_failed.append(len(states))
                raise RuntimeError("injected fault")
            return forward(states, ids)

        engine._forward = faulty_forward

        async def together():
            async def run(rid):
                out = engine.add_request(rid, prompt, params)
                try:
                    return [t for step in [s async for s in out] for t in step.token_ids]
                except Exception as exc:
                    return exc

            return await asyncio.gather(*(run(r) for r in ("a", "b", "poison", "c", "d")))

        results = asyncio.run(together())
    finally:
        engine.stop()
    by_id = dict(zip(("a", "b", "poison", "c", "d"), results, strict=True))
    assert isinstance(by_id.pop("poison"), Exception)
    assert all(tokens == solo for tokens in by_id.values()), by_id
    assert max(batch_sizes_failed) > 1 and batch_sizes_failed[-1] == 1  # failed batched, then alone
    assert engine.num_requests == 0
