"""Grammar-constrained decoding in the transformers thinker, on the random tiny checkpoint (whose
text is noise, so only the grammar can make its output valid): JSON that validates, a named tool
call, the first (prefilled) token masked too, the end of the grammar ending the answer even with
ignore_eos, unconstrained rows of a mixed batch unchanged, grammars compiled once, refusals naming
the param, and a faulty grammar failing its own request only."""

from __future__ import annotations

import asyncio
import json
import time

import jsonschema
import pytest

from gateway.tools.spec import CALL_END, Function, Named, call_begin, tool_use
from omnistream.engine.sampling import SamplingParams
from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine, ThinkerParams
from omnistream.request.errors import InternalError, InvalidRequest
from omnistream.request.structured import StructuredOutput

pytestmark = pytest.mark.unit

WEATHER = {
    "type": "object",
    "properties": {
        # A pattern, not maxLength: xgrammar 0.2.9 lets a maxLength string hold raw control
        # characters, which strict JSON parsers refuse.
        "city": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "hourly": {"type": "boolean"},
    },
    "required": ["city", "days", "unit", "hourly"],
    "additionalProperties": False,
}
SCHEMA = StructuredOutput("json_schema", json.dumps(WEATHER))
# What the gateway sends for a named function (tool_choice {"function": {"name": "get_weather"}}):
# the hermes / Qwen3 call format, the arguments held to the function's parameters.
CALL_BEGIN = call_begin("get_weather")
NAMED_CALL = tool_use([Function("get_weather", parameters=WEATHER)], Named("get_weather")).structured_output
assert NAMED_CALL is not None


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = ThinkerEngine(
        tiny_model_dir,
        ThinkerEngineSettings(
            dtype="float32", max_batch=4, max_model_len=512, max_requests=8, prefix_cache_gib=0
        ),
    )
    e.start()
    yield e
    e.stop()


def _prompt(engine, text: str = "What is the weather in Paris?") -> list[int]:
    return engine.encode_chat([{"role": "user", "content": text}])


async def _answer(engine, rid, params, prompt=None, precompile=True):
    """(text, token ids, finish reason) of one request."""
    grammar = None
    if precompile and params.structured_output is not None:
        grammar = await engine.compile_grammar(params.structured_output)
    out = engine.add_request(rid, prompt or _prompt(engine), params, grammar=grammar)
    steps = [s async for s in out]
    ids = [t for s in steps for t in s.token_ids]
    return "".join(s.text_delta for s in steps), ids, steps[-1].finish_reason


def _json_of(engine, text: str, ids: list[int]) -> object:
    assert ids[-1] in engine.eos_ids  # the grammar ended, with the end of turn
    return json.loads(text.removesuffix(engine.tokenizer.decode([ids[-1]])))


def _sampled(seed: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, top_p=0.95, seed=seed)


def test_json_schema_output_always_validates(engine):
    async def run():
        runs = [_answer(engine, "greedy", ThinkerParams(160, structured_output=SCHEMA))]
        runs += [
            _answer(engine, f"s{seed}", ThinkerParams(160, sampling=_sampled(seed), structured_output=SCHEMA))
            for seed in range(5)
        ]
        return await asyncio.gather(*runs)

    for text, ids, reason in asyncio.run(run()):
        assert reason == "stop"
        jsonschema.validate(_json_of(engine, text, ids), WEATHER)


def test_json_object_starts_at_the_first_token(engine):
    # The first token comes from the prefill's logits: masked there too.
    text, ids, reason = asyncio.run(
        _answer(engine, "obj", ThinkerParams(64, structured_output=StructuredOutput("json_object")))
    )
    assert engine.tokenizer.decode(ids[:1]).startswith("{")
    assert reason == "stop" and isinstance(_json_of(engine, text, ids), dict)


def test_a_named_call_has_arguments_that_validate(engine):
    async def run():
        return await asyncio.gather(
            *(
                _answer(
                    engine,
                    f"call{seed}",
                    ThinkerParams(200, sampling=_sampled(seed), structured_output=NAMED_CALL),
                )
                for seed in range(3)
            )
        )

    for text, ids, reason in asyncio.run(run()):
        assert reason == "stop"
        body = text.removesuffix(engine.tokenizer.decode([ids[-1]]))
        assert body.startswith(CALL_BEGIN) and body.endswith(CALL_END)
        jsonschema.validate(json.loads(body[len(CALL_BEGIN) : -len(CALL_END)]), WEATHER)


def test_ignore_eos_never_runs_a_grammar_past_its_end(engine):
    text, ids, reason = asyncio.run(
        _answer(engine, "ign", ThinkerParams(200, ignore_eos=True, structured_output=SCHEMA))
    )
    assert reason == "stop" and len(ids) < 200
    jsonschema.validate(_json_of(engine, text, ids), WEATHER)


def test_an_unconstrained_request_batched_with_a_constrained_one_gets_its_tokens_alone(engine):
    free = ThinkerParams(40, ignore_eos=True)
    _, alone, _ = asyncio.run(_answer(engine, "alone", free))
    sizes: list[int] = []

    def listener(e, seconds):
        sizes.append(e.stats.last_batch_size)

    engine.add_step_listener(listener)
    try:

        async def run():
            constrained = ThinkerParams(40, ignore_eos=True, structured_output=SCHEMA)
            return await asyncio.gather(_answer(engine, "free", free), _answer(engine, "bound", constrained))

        (_, together, _), (_, bound, _) = asyncio.run(run())
    finally:
        engine.remove_step_listener(listener)
    assert together == alone
    assert max(sizes) == 2  # they did share decode steps
    assert bound != together[: len(bound)]


def test_a_grammar_is_compiled_once_across_requests(engine):
    spec = StructuredOutput(
        "json_schema", json.dumps({"type": "array", "items": {"enum": [1, 2]}, "maxItems": 3})
    )
    asyncio.run(_answer(engine, "first", ThinkerParams(32, structured_output=spec)))
    compiles, hits = engine.stats.grammar_compiles, engine.stats.grammar_cache_hits
    asyncio.run(_answer(engine, "second", ThinkerParams(32, structured_output=spec)))
    asyncio.run(_answer(engine, "third", ThinkerParams(32, structured_output=spec), precompile=False))
    assert engine.stats.grammar_compiles == compiles
    assert engine.stats.grammar_cache_hits == hits + 2


def test_a_bad_grammar_is_refused_by_param_and_the_next_request_served(engine):
    bad_schema = StructuredOutput("json_schema", '{"type": "objec"}')
    bad_tag = StructuredOutput("structural_tag", '{"type": "structural_tag", "format": {"type": "nope"}}')

    async def run():
        with pytest.raises(InvalidRequest) as err:
            await engine.compile_grammar(bad_schema)
        assert err.value.field == "response_format"
        with pytest.raises(InvalidRequest) as err:  # not compiled beforehand: add_request compiles it
            engine.add_request("bad", _prompt(engine), ThinkerParams(8, structured_output=bad_tag))
        assert err.value.field == "tools"
        assert engine.num_requests == 0
        return await _answer(engine, "next", ThinkerParams(160, structured_output=SCHEMA))

    text, ids, _ = asyncio.run(run())
    jsonschema.validate(_json_of(engine, text, ids), WEATHER)


def test_a_slow_compile_is_refused_and_the_next_request_served(engine):
    props = {f"p{i}": {"type": "string", "pattern": f"[a-z]{{{i % 5 + 1},40}}y{i}"} for i in range(300)}
    slow = StructuredOutput("json_schema", json.dumps({"type": "object", "properties": props}))
    engine.grammars.timeout = 0.001
    try:
        with pytest.raises(InvalidRequest) as err:
            asyncio.run(engine.compile_grammar(slow))
        assert err.value.field == "response_format" and "did not compile within" in err.value.message
    finally:
        engine.grammars.timeout = 10.0
    text, ids, _ = asyncio.run(_answer(engine, "after-slow", ThinkerParams(160, structured_output=SCHEMA)))
    jsonschema.validate(_json_of(engine, text, ids), WEATHER)


def test_an_aborted_request_drops_its_matcher(engine):
    async def run():
        params = ThinkerParams(200, ignore_eos=True, structured_output=StructuredOutput("json_object"))
        out = engine.add_request(
            "drop", _prompt(engine), params, grammar=await engine.compile_grammar(params.structured_output)
        )
        state = engine.state("drop")
        assert state.matcher is not None
        await out.get()
        engine.abort("drop")
        return state

    state = asyncio.run(run())
    deadline = time.monotonic() + 5
    while state.matcher is not None and time.monotonic() < deadline:
        engine.wake()
        time.sleep(0.01)
    assert state.matcher is None


class _BrokenMatcher:
    """A grammar whose native side fails mid-answer (what a bug in it would look like)."""

    def fill_next_token_bitmask(self, bitmask, row):
        raise RuntimeError("matcher state corrupted")


def test_a_faulty_grammar_fails_its_own_request_only(engine):
    free = ThinkerParams(30, ignore_eos=True)
    _, alone, _ = asyncio.run(_answer(engine, "solo", free))

    async def run():
        params = ThinkerParams(30, ignore_eos=True, structured_output=SCHEMA)
        faulty = engine.add_request(
            "faulty", _prompt(engine), params, grammar=await engine.compile_grammar(SCHEMA)
        )
        engine.state("faulty").matcher = _BrokenMatcher()
        innocent = asyncio.ensure_future(_answer(engine, "innocent", free))
        with pytest.raises(InternalError):
            async for _ in faulty:
                pass
        return await innocent

    _, together, _ = asyncio.run(run())
    assert together == alone
