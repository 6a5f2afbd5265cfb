"""Thinker engine: sampling knobs, abort, validation."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from omnistream.engine.output_stream import OutputStream
from omnistream.engine.sampling import SamplingParams
from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine, ThinkerParams
from omnistream.request.errors import InternalError, InvalidRequest, Overloaded
from tests.unit.models.qwen3_omni.prefill_helpers import long_prompt, prefill_chunk


def _engine(model_dir, max_requests: int = 6) -> ThinkerEngine:
    # No prefix cache: these tests run the same prompts again and watch their prefill (the cache's
    # own tests are test_prefix.py).
    return ThinkerEngine(
        model_dir,
        ThinkerEngineSettings(
            dtype="float32", max_batch=4, max_model_len=256, max_requests=max_requests, prefix_cache_gib=0
        ),
    )


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = _engine(tiny_model_dir)
    e.start()
    yield e
    e.stop()


def _prompt(engine) -> list[int]:
    return engine.encode_chat([{"role": "user", "content": "Tell me about the sea."}])


async def _run_ids(engine, rid, prompt, params) -> list[int]:
    out = engine.add_request(rid, prompt, params)
    return [t for step in [s async for s in out] for t in step.token_ids]


async def _run(engine, rid, params) -> list[int]:
    return await _run_ids(engine, rid, _prompt(engine), params)


async def _tokens_or_error(engine, rid, prompt, params) -> list[int] | Exception:
    """A request's tokens, or the error it ended with (the fault tests run innocent and poisoned
    requests side by side)."""
    try:
        return await _run_ids(engine, rid, prompt, params)
    except Exception as exc:
        return exc


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
    engine = ThinkerEngine(
        tiny_model_dir, ThinkerEngineSettings(dtype="float32", max_batch=8, max_model_len=256)
    )
    params = ThinkerParams(12, True)
    prompt = _prompt(engine)
    engine.start()
    try:
        solo = asyncio.run(_run(engine, "solo", params))
        forward = engine.forward
        batch_sizes_failed: list[int] = []

        def faulty_forward(states, ids, **kwargs):
            # Decode steps only: the prefill succeeds, then the request poisons every batch it joins.
            if ids.shape[1] == 1 and any(s.request_id == "poison" for s in states):
                batch_sizes_failed.append(len(states))
                raise RuntimeError("injected fault")
            return forward(states, ids, **kwargs)

        engine.forward = faulty_forward

        async def together():
            rids = ("a", "b", "poison", "c", "d")
            return await asyncio.gather(*(_tokens_or_error(engine, r, prompt, params) for r in rids))

        results = asyncio.run(together())
    finally:
        engine.stop()
    by_id = dict(zip(("a", "b", "poison", "c", "d"), results, strict=True))
    assert isinstance(by_id.pop("poison"), Exception)
    assert all(tokens == solo for tokens in by_id.values()), by_id
    assert max(batch_sizes_failed) > 1 and batch_sizes_failed[-1] == 1  # failed batched, then alone
    assert engine.num_requests == 0


def test_a_batched_token_choice_that_fails_leaves_the_lengths_for_the_retry(tiny_model_dir):
    """The choice comes after the forward: when it raises for a batch, the members are retried alone
    from the same KV lengths (nothing written twice), so the innocent ones keep their exact output."""
    engine = ThinkerEngine(
        tiny_model_dir, ThinkerEngineSettings(dtype="float32", max_batch=8, max_model_len=256)
    )
    params = ThinkerParams(12, True)
    prompt = _prompt(engine)
    engine.start()
    try:
        solo = asyncio.run(_run(engine, "solo", params))
        choose = engine.choose

        def faulty_choose(states, logits, first, filling=None):
            if not first and any(s.request_id == "poison" for s in states):
                raise RuntimeError("injected fault in the sampler")
            return choose(states, logits, first, filling=filling)

        engine.choose = faulty_choose

        async def together():
            rids = ("a", "poison", "b")
            return await asyncio.gather(*(_tokens_or_error(engine, r, prompt, params) for r in rids))

        results = asyncio.run(together())
    finally:
        engine.stop()
    by_id = dict(zip(("a", "poison", "b"), results, strict=True))
    assert isinstance(by_id.pop("poison"), Exception)
    assert all(tokens == solo for tokens in by_id.values()), by_id


def test_a_chunked_prompt_gives_the_unchunked_result(engine):
    """Chunk sizes 1, 7, len-1 and len: the same greedy and seeded-sampled tokens, also with two
    prompts sharing each step's prefill budget and decoding next to each other."""
    prompt = long_prompt(engine)
    greedy = ThinkerParams(16, True)
    sampled = ThinkerParams(16, True, SamplingParams(temperature=1.1, top_k=40, seed=77))

    async def pair(tag: str):
        return await asyncio.gather(
            _run_ids(engine, f"g-{tag}", prompt, greedy), _run_ids(engine, f"s-{tag}", prompt, sampled)
        )

    with prefill_chunk(engine, len(prompt)):
        solo = [
            asyncio.run(_run_ids(engine, "g", prompt, greedy)),
            asyncio.run(_run_ids(engine, "s", prompt, sampled)),
        ]
    for chunk in (1, 7, len(prompt) - 1, len(prompt)):
        with prefill_chunk(engine, chunk):
            assert asyncio.run(pair(str(chunk))) == solo, chunk
    assert len(solo[0]) == 16 and solo[0] != solo[1]


def test_running_request_decodes_between_the_pieces_of_a_long_prefill(engine):
    """Each step prefills one piece of the long prompt and then decodes the running request, so
    the running request gets a token between every two pieces (observed per step, not timed), and
    its tokens are those of a solo run."""
    chunk = 16
    running_params = ThinkerParams(120, True)
    solo = asyncio.run(_run_ids(engine, "solo", _prompt(engine), running_params))
    long_ids = long_prompt(engine)
    steps: list[tuple[int, int]] = []  # per step after the long request came: (its prefilled, running tokens)

    async def run():
        out = engine.add_request("running", _prompt(engine), running_params)
        tokens = [t for t in (await out.get()).token_ids]
        running = engine.state("running")
        long_out = engine.add_request("long", long_ids, ThinkerParams(1, True))
        long = engine.state("long")

        def listener(_engine, _seconds):
            steps.append((long.prefilled, len(running.generated)))

        engine.add_step_listener(listener)
        try:
            first = asyncio.ensure_future(long_out.get())
            async for step in out:
                tokens += step.token_ids
            await first
        finally:
            engine.remove_step_listener(listener)
        return tokens

    with prefill_chunk(engine, chunk):
        tokens = asyncio.run(run())
    assert tokens == solo
    pieces = [(p, n) for i, (p, n) in enumerate(steps) if p != (steps[i - 1][0] if i else 0)]
    assert [p for p, _ in pieces] == [*range(chunk, len(long_ids), chunk), len(long_ids)]
    counts = [n for _, n in pieces]
    assert all(b > a for a, b in itertools.pairwise(counts)), counts  # a token per piece


def test_a_request_failing_in_its_prefill_fails_alone(tiny_model_dir):
    """A piece of a chunked prefill that raises fails that request only: a running request and a
    request prefilling in the same steps keep their exact tokens, and the failed piece left the KV
    length where the last good piece put it."""
    engine = ThinkerEngine(
        tiny_model_dir,
        ThinkerEngineSettings(dtype="float32", max_batch=4, max_model_len=256, prefill_chunk=8),
    )
    params = ThinkerParams(10, True)
    prompt = long_prompt(engine)
    engine.start()
    try:
        solo_short = asyncio.run(_run_ids(engine, "solo-short", _prompt(engine), ThinkerParams(40, True)))
        solo_long = asyncio.run(_run_ids(engine, "solo-long", prompt, params))
        forward = engine.forward
        at_failure: list[tuple[int, int]] = []

        def faulty_forward(states, ids, **kwargs):
            state = states[0]
            if state.request_id == "poison" and state.prefilled >= 16:  # a later piece
                at_failure.append((state.prefilled, engine.cache.lengths[state.slot]))
                raise RuntimeError("injected fault")
            return forward(states, ids, **kwargs)

        engine.forward = faulty_forward

        async def together():
            short = ThinkerParams(40, True)
            running = asyncio.ensure_future(_tokens_or_error(engine, "running", _prompt(engine), short))
            rest = await asyncio.gather(
                _tokens_or_error(engine, "poison", prompt, params),
                _tokens_or_error(engine, "other", prompt, params),
            )
            return [await running, *rest]

        running, poison, other = asyncio.run(together())
    finally:
        engine.stop()
    assert isinstance(poison, InternalError) and "injected fault" in str(poison)
    assert running == solo_short and other == solo_long
    # Failed once (alone, at once), with the KV length where its good pieces left it; how many
    # positions those held depends on what shared the budget with them.
    assert len(at_failure) == 1 and at_failure[0][0] == at_failure[0][1] >= 16
    assert engine.num_requests == 0 and engine.cache.free_slots == 4


def test_the_thinker_hands_off_the_gil_after_a_first_token_a_first_text_and_an_end(tiny_model_dir):
    # Its tokens may leave a few steps together, but not what a client waits for: the first token
    # (the talker's start), the first text (the second token when the first is a byte of an
    # unfinished character) and the last. Steps run on this thread.
    engine = ThinkerEngine(
        tiny_model_dir,
        ThinkerEngineSettings(dtype="float32", max_batch=2, max_model_len=256, prefix_cache_gib=0),
    )
    assert not engine.hand_off_every_step
    asked: list[int] = []
    engine.hand_off = lambda: asked.append(1)  # type: ignore[method-assign]

    class FirstTokenNoText:  # the detokenizer holding back a byte of an unfinished character
        def __init__(self) -> None:
            self.tokens = 0

        def add(self, token: int) -> str:
            self.tokens += 1
            return "" if self.tokens == 1 else "x"

        def flush(self) -> str:
            return ""

    async def steps() -> list[int]:
        engine.add_request("r", _prompt(engine), ThinkerParams(5, True))
        engine.state("r").detok = FirstTokenNoText()
        per_step = []
        while (work := engine.plan_step()) is not None:
            before = len(asked)
            engine.run_step(work)
            per_step.append(len(asked) - before)
        return per_step

    assert asyncio.run(steps()) == [1, 1, 0, 0, 1]


def test_background_work_steps_only_when_nothing_else_can_and_is_unchanged_by_it(engine):
    """A transcription (background) beside an answer: while the answer runs, the transcription
    gets no token, whoever arrived first; once the answer ends it runs to the same tokens it makes
    alone (greedy), so being paused costs it nothing but time."""
    answer = ThinkerParams(24, True)
    background = ThinkerParams(12, True, background=True)

    async def run() -> tuple[list[int], list[int], list[str]]:
        order: list[str] = []

        async def collect(rid: str, out: OutputStream[Any]) -> list[int]:
            tokens: list[int] = []
            async for step in out:
                order.extend(rid for _ in step.token_ids)
                tokens.extend(step.token_ids)
            return tokens

        prompt = _prompt(engine)
        # The background request is admitted first, the answer right after it (no await between:
        # on a loaded machine a test that tokenized the answer's prompt in between saw the
        # engine run five background steps before the answer existed).
        transcribing = engine.add_request("bg", prompt, background)
        answering = engine.add_request("fg", prompt, answer)
        answered, transcribed = await asyncio.gather(collect("fg", answering), collect("bg", transcribing))
        return answered, transcribed, order

    alone = asyncio.run(_run(engine, "bg-alone", background))
    answered, transcribed, order = asyncio.run(run())
    assert transcribed == alone
    assert len(answered) == 24
    last_answer = max(i for i, rid in enumerate(order) if rid == "fg")
    # The background request may have taken its first step (its prefill and first token) before
    # the answer arrived; after that, not one token until the answer has all of its own.
    assert order[: last_answer + 1].count("bg") <= 1, order


def test_background_work_runs_while_the_others_wait_for_their_reader(tiny_model_dir):
    """An answer whose reader is slow (its output is full) cannot step: background work takes
    those steps instead of idling, so it is never starved by an answer that waits."""
    e = _engine(tiny_model_dir, max_requests=4)
    e.output_capacity = 2
    e.start()
    try:

        async def run() -> list[int]:
            stalled = e.add_request("fg", _prompt(e), ThinkerParams(40, True))
            out = e.add_request("bg", _prompt(e), ThinkerParams(8, True, background=True))
            tokens = [t for step in [s async for s in out] for t in step.token_ids]
            assert e.has_request("fg")  # never read: it waits with its output full
            e.abort("fg", stalled)
            return tokens

        assert len(asyncio.run(asyncio.wait_for(run(), 60))) == 8
    finally:
        e.stop()
