"""The grammar's promise on any checkpoint (issue 59): random tiny checkpoints (seeds of their own,
answers that end and answers that run on), the in-process transformers thinker, generated schemas
(tests/json_schemas.py), greedy and seeded sampling. Every constrained answer is strict compact JSON
(no raw control character, no whitespace between tokens), cut or not; every answer that ends parses
with strict `json.loads` and validates; under a schema that bounds every string, array and integer
the answer ends, within the tokens the schema allows (each byte of its longest compact JSON at
most one token, then the end of turn). The same for forced tool calls (a named function, `required`
with one call or several): each call's arguments. `make test` runs a few checkpoints and schemas,
`make test-slow` the larger sweep."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gateway.tools.spec import CALL_END, Function, Named, call_begin, tool_use
from omnistream.engine.sampling import SamplingParams
from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.models.qwen3_omni import tiny
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine, ThinkerParams
from omnistream.request.structured import StructuredOutput
from tests.json_schemas import answer_problems, as_parameters, calls_of, max_json_bytes, schemas

pytestmark = pytest.mark.unit

# (seed, answers_end): none of them the seeds the other tests use (0, 7).
CHECKPOINTS = [(11, True), (23, True), (37, False)]
SLOW_CHECKPOINTS = [(s, s % 3 != 0) for s in range(101, 111)]
SAMPLINGS = [
    SamplingParams(),
    SamplingParams(temperature=1.0, top_p=0.95, seed=5),
    SamplingParams(temperature=1.3, seed=9),
]
# An answer under an unbounded schema is cut here (its beginning is still checked).
UNBOUNDED_TOKENS = 48
# The bounded schemas drawn: their longest answer (bytes) at most this, to keep the runs short.
MAX_BOUND = 200
_CACHES = Path(__file__).resolve().parents[5] / ".cache"

SETTINGS = settings(
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: each example runs models
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _schemas() -> st.SearchStrategy[dict[str, Any]]:
    bounded = schemas(bounded=True, max_leaves=4).filter(lambda s: (max_json_bytes(s) or 0) <= MAX_BOUND)
    return st.one_of(bounded, schemas(max_leaves=4))


def _engines(checkpoints: list[tuple[int, bool]]) -> Iterator[list[ThinkerEngine]]:
    engines = []
    try:
        for seed, ends in checkpoints:
            name = f"test-tiny-model-{tiny.builder_version()}-grammar-s{seed}{'-ending' if ends else ''}"
            directory = tiny.built(_CACHES / name, seed=seed, answers_end=ends)
            engine = ThinkerEngine(
                str(directory),
                ThinkerEngineSettings(
                    dtype="float32", max_batch=8, max_model_len=1024, max_requests=32, prefix_cache_gib=0
                ),
            )
            engine.start()
            engines.append(engine)
        yield engines
    finally:
        for engine in engines:
            engine.stop()


@pytest.fixture(scope="module")
def engines() -> Iterator[list[ThinkerEngine]]:
    yield from _engines(CHECKPOINTS)


@pytest.fixture(scope="module")
def slow_engines() -> Iterator[list[ThinkerEngine]]:
    yield from _engines(SLOW_CHECKPOINTS)


async def _answer(engine: ThinkerEngine, rid: str, structured: StructuredOutput, max_tokens: int, sampling):
    """(text without the end of turn, token ids, finish reason) of one constrained answer."""
    prompt = engine.encode_chat([{"role": "user", "content": "Answer in JSON, please."}])
    grammar = await engine.compile_grammar(structured)
    out = engine.add_request(
        rid,
        prompt,
        ThinkerParams(max_tokens, sampling=sampling, structured_output=structured),
        grammar=grammar,
    )
    steps = [s async for s in out]
    ids = [t for s in steps for t in s.token_ids]
    text = "".join(s.text_delta for s in steps)
    if steps[-1].finish_reason == "stop":
        assert ids[-1] in engine.eos_ids  # the grammar's end chose the end of turn
        text = text.removesuffix(engine.tokenizer.decode([ids[-1]]))
    return text, ids, steps[-1].finish_reason


def _run_all(
    engines: list[ThinkerEngine], structured: StructuredOutput, max_tokens: int
) -> list[tuple[Any, ...]]:
    """Every engine's answer for every sampling, batched on each engine."""

    async def run():
        runs = [
            _answer(engine, f"e{i}-s{j}", structured, max_tokens, sampling)
            for i, engine in enumerate(engines)
            for j, sampling in enumerate(SAMPLINGS)
        ]
        return await asyncio.gather(*runs)

    return asyncio.run(run())


def _check_json(engines: list[ThinkerEngine], schema: dict[str, Any]) -> None:
    bound = max_json_bytes(schema)
    structured = StructuredOutput("json_schema", json.dumps(schema))
    max_tokens = UNBOUNDED_TOKENS if bound is None else bound + 8
    for text, ids, reason in _run_all(engines, structured, max_tokens):
        assert not answer_problems(text, reason == "stop", schema), (schema, text, reason)
        if bound is not None:  # every string, array and integer bounded: the answer ends in time
            assert reason == "stop" and len(ids) <= bound + 1, (schema, bound, len(ids), text)


@settings(SETTINGS, max_examples=14)
@given(_schemas())
def test_json_answers_on_random_checkpoints(engines, schema):
    _check_json(engines, schema)


def test_json_object_answers_on_random_checkpoints(engines):
    _check_json(engines, {"type": "object"})  # response_format json_object's grammar, as a schema
    for text, _, reason in _run_all(engines, StructuredOutput("json_object"), UNBOUNDED_TOKENS):
        assert not answer_problems(text, reason == "stop", {"type": "object"}), text


def _check_calls(engines: list[ThinkerEngine], parameters: list[dict[str, Any]], choice: str) -> None:
    functions = [Function(f"f{i}", parameters=as_parameters(p)) for i, p in enumerate(parameters)]
    schemas_by_name = {f.name: f.parameters for f in functions}
    use = tool_use(functions, Named("f0") if choice == "named" else "required", choice == "required")
    assert use.structured_output is not None
    bounds = [
        max_json_bytes(schemas_by_name[f.name]) for f in (functions[:1] if choice == "named" else functions)
    ]
    one_call = choice != "required"
    bound = None
    if one_call and None not in bounds:
        longest_name = max(len(f.name) for f in functions)
        bound = (
            len(call_begin("f" * longest_name).encode())
            + max(b for b in bounds if b)
            + len(CALL_END.encode())
        )
    max_tokens = UNBOUNDED_TOKENS * 2 if bound is None else bound + 8
    for text, ids, reason in _run_all(engines, use.structured_output, max_tokens):
        calls = calls_of(text)
        if reason == "stop":
            assert len(calls) == 1 if one_call else len(calls) >= 1, text
        for name, arguments in calls:  # each call that ended: whole arguments
            assert name in schemas_by_name
            assert not answer_problems(arguments, True, schemas_by_name[name]), (name, arguments)
        cut = text.rsplit("</tool_call>", 1)[-1]
        if '"arguments": ' in cut:  # the call cut by max_tokens: what it has is strict
            arguments = cut.split('"arguments": ', 1)[1]
            frame = next((k for k in range(len(CALL_END), 1, -1) if arguments.endswith(CALL_END[:k])), 0)
            assert not answer_problems(arguments[: len(arguments) - frame], False, {}), cut
        if bound is not None:
            assert reason == "stop" and len(ids) <= bound + 1, (parameters, bound, len(ids), text)


@settings(SETTINGS, max_examples=10)
@given(st.lists(_schemas(), min_size=1, max_size=2), st.sampled_from(["named", "required-one", "required"]))
def test_forced_calls_on_random_checkpoints(engines, parameters, choice):
    _check_calls(engines, parameters, choice)


@pytest.mark.slow
@settings(SETTINGS, max_examples=60)
@given(_schemas())
def test_json_answers_on_more_checkpoints(slow_engines, schema):
    _check_json(slow_engines, schema)


@pytest.mark.slow
@settings(SETTINGS, max_examples=40)
@given(st.lists(_schemas(), min_size=1, max_size=3), st.sampled_from(["named", "required-one", "required"]))
def test_forced_calls_on_more_checkpoints(slow_engines, parameters, choice):
    _check_calls(slow_engines, parameters, choice)
