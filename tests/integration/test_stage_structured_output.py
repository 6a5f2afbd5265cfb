"""A thinker service of each backend (transformers; vLLM where .venv-vllm exists) as a real process
on a loopback port, given output grammars over ThinkerOpen.structured_output: the random tiny
checkpoint's answers validate against the schema and the named function's parameters, are strict
compact JSON and end within their schema's bound, the greedy constrained answer is the in-process
transformers thinker's, a grammar that does not compile is INVALID_ARGUMENT naming the client's
param (omni-error-field) and the next request is served."""

from __future__ import annotations

import asyncio
import json

import grpc
import jsonschema
import pytest

from gateway.tools.spec import CALL_END, Function, Named, call_begin, tool_use
from omnistream.cli.launcher import start_services
from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.proto.omni.v1 import common_pb2, stage_pb2, stage_pb2_grpc
from omnistream.request.stage_chain import ThinkerParams
from omnistream.request.structured import StructuredOutput
from omnistream.service.server import ERROR_FIELD_METADATA_KEY
from omnistream.wire.chunk_key import ChunkKey, Stage
from tests.json_schemas import answer_problems, max_json_bytes
from tests.vllm_env import VLLM_PYTHON, requires_vllm

from .conftest import metric

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
# What the gateway sends for a named function (gateway/tools/spec.py).
CALL_BEGIN = call_begin("get_weather")
_NAMED = tool_use([Function("get_weather", parameters=WEATHER)], Named("get_weather")).structured_output
assert _NAMED is not None
NAMED_CALL = _NAMED.spec
MESSAGES = [common_pb2.Message(role="user", content="What is the weather in Paris?")]


@pytest.fixture(scope="module", params=["transformers", pytest.param("vllm", marks=requires_vllm)])
def thinker(request, tiny_model_dir):
    """One thinker service of the backend, float32 (the vLLM thinker's widest dtype)."""
    vllm = request.param == "vllm"
    args = ["serve", "thinker", "--model", tiny_model_dir, "--dtype", "float32", "--max-batch", "4"]
    services = start_services(
        {"thinker": [*args, *(["--backend", "vllm"] if vllm else [])]},
        timeout=300,
        pythons={"thinker": VLLM_PYTHON} if vllm else None,
    )
    try:
        yield request.param, services["thinker"]
    finally:
        for service in services.values():
            service.stop()


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """The in-process transformers thinker at the services' dtype."""
    from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine

    engine = ThinkerEngine(
        tiny_model_dir, ThinkerEngineSettings(dtype="float32", max_batch=1, max_model_len=512)
    )
    engine.start()
    yield engine
    engine.stop()


def _open(
    rid: str, kind: str, spec: str, seed: int | None = None, max_tokens: int = 200, **kw
) -> stage_pb2.ThinkerRequest:
    sampling = common_pb2.Sampling(temperature=1.0, top_p=0.95, seed=seed) if seed is not None else None
    open_ = stage_pb2.ThinkerOpen(
        request_id=rid,
        messages=MESSAGES,
        max_tokens=max_tokens,
        sampling=sampling,
        structured_output=common_pb2.StructuredOutput(kind=kind, spec=spec),
        **kw,
    )
    return stage_pb2.ThinkerRequest(key=ChunkKey(rid, Stage.GATEWAY, 0).to_proto(), open=open_)


async def _stream(service, request: stage_pb2.ThinkerRequest) -> tuple[list[int], str]:
    """(token ids, finish reason) of one thinker stream."""
    async with grpc.aio.insecure_channel(service.address) as channel:
        call = stage_pb2_grpc.ThinkerServiceStub(channel).Stream(timeout=120)
        await call.write(request)
        await call.done_writing()
        tokens, reason = [], ""
        async for chunk in call:
            tokens.extend(chunk.token_ids)
            reason = chunk.finish_reason or reason
        return tokens, reason


def _text(reference, tokens: list[int]) -> str:
    """The answer's text without its end of turn (which the grammar's end must have chosen)."""
    assert tokens[-1] in reference.eos_ids
    return reference.tokenizer.decode(tokens[:-1])


def test_a_json_schema_answer_validates_and_is_the_in_process_thinkers(thinker, reference):
    _, service = thinker
    structured = StructuredOutput("json_schema", json.dumps(WEATHER))
    tokens, reason = asyncio.run(_stream(service, _open("schema", structured.kind, structured.spec)))
    assert reason == "stop"
    jsonschema.validate(json.loads(_text(reference, tokens)), WEATHER)

    async def in_process() -> list[int]:
        prompt = reference.encode_chat([{"role": "user", "content": MESSAGES[0].content}])
        out = reference.add_request("ref", prompt, ThinkerParams(200, structured_output=structured))
        return [t for step in [s async for s in out] for t in step.token_ids]

    assert tokens == asyncio.run(in_process())


def test_named_calls_batched_together_all_validate(thinker, reference):
    _, service = thinker

    async def run():
        return await asyncio.gather(
            *(_stream(service, _open(f"call{s}", "structural_tag", NAMED_CALL, seed=s)) for s in range(4))
        )

    for tokens, reason in asyncio.run(run()):
        assert reason == "stop"
        text = _text(reference, tokens)
        assert text.startswith(CALL_BEGIN) and text.endswith(CALL_END)
        jsonschema.validate(json.loads(text[len(CALL_BEGIN) : -len(CALL_END)]), WEATHER)


# issue 59: a free-text string of bounded length (xgrammar's own grammar of it took raw control
# characters), a bounded integer; and a call whose free-text argument the call grammar let a weak
# model pad with whitespace (tabs, `\r`, blank lines) until max_tokens.
ANSWER = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 24},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "score"],
}
FREE_WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}


def test_answers_are_strict_compact_json_that_end_within_their_bound(thinker, reference):
    """On either backend (the vLLM thinker gives vLLM the grammars the transformers thinker compiles,
    built with its own xgrammar), greedy and sampled: every answer is strict compact JSON (no raw
    control character, no whitespace between tokens) that validates, and ends within the tokens its
    schema allows."""
    _, service = thinker
    schema = StructuredOutput("json_schema", json.dumps(ANSWER))
    schema_bound = max_json_bytes(ANSWER)
    named = tool_use(
        [Function("get_weather", parameters=FREE_WEATHER)], Named("get_weather")
    ).structured_output
    assert schema_bound is not None and named is not None
    call_bound = len(CALL_BEGIN.encode()) + (max_json_bytes(FREE_WEATHER) or 0) + len(CALL_END.encode())

    async def run():
        seeds = [None, *range(6)]
        answers = [
            _stream(
                service, _open(f"answer-{s}", schema.kind, schema.spec, seed=s, max_tokens=schema_bound + 8)
            )
            for s in seeds
        ]
        calls = [
            _stream(service, _open(f"call-{s}", named.kind, named.spec, seed=s, max_tokens=call_bound + 8))
            for s in seeds
        ]
        return await asyncio.gather(*answers), await asyncio.gather(*calls)

    answers, calls = asyncio.run(run())
    for tokens, reason in answers:
        assert reason == "stop" and len(tokens) <= schema_bound + 1
        text = _text(reference, tokens)
        assert not answer_problems(text, True, ANSWER), text
    for tokens, reason in calls:
        assert reason == "stop" and len(tokens) <= call_bound + 1
        text = _text(reference, tokens)
        assert text.startswith(CALL_BEGIN) and text.endswith(CALL_END)
        arguments = text[len(CALL_BEGIN) : -len(CALL_END)]
        assert not answer_problems(arguments, True, FREE_WEATHER), arguments


@pytest.mark.parametrize(
    ("kind", "spec", "field"),
    [
        ("json_schema", '{"type": "objec"}', "response_format"),
        ("json_schema", "{not json", "response_format"),
        ("structural_tag", '{"type": "structural_tag", "format": {"type": "nope"}}', "tools"),
        ("regex", "a+", "structured_output.kind"),
    ],
)
def test_a_bad_grammar_is_invalid_argument_naming_the_param_and_the_next_is_served(
    thinker, reference, kind, spec, field
):
    _, service = thinker
    with pytest.raises(grpc.aio.AioRpcError) as err:
        asyncio.run(_stream(service, _open("bad", kind, spec)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(err.value.trailing_metadata())[ERROR_FIELD_METADATA_KEY] == field
    tokens, reason = asyncio.run(_stream(service, _open("next", "json_object", "")))
    assert reason == "stop" and isinstance(json.loads(_text(reference, tokens)), dict)


def test_the_compile_time_is_on_the_transformers_thinkers_metrics(thinker):
    backend, service = thinker
    if backend != "transformers":
        pytest.skip("vLLM compiles inside its engine core (its own metrics)")
    before = metric(service, "omnistream_stage_grammar_compile_seconds_count")
    spec = json.dumps({"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 4})
    for rid in ("metric-1", "metric-2"):  # the second takes the compiled grammar from the cache
        asyncio.run(_stream(service, _open(rid, "json_schema", spec)))
    assert metric(service, "omnistream_stage_grammar_compile_seconds_count") == before + 1
