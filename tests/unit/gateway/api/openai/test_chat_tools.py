"""Tools and response_format through the REST face, read with the official openai SDK, against a
core that validates as the real one does and answers with scripted model text: what the request
becomes, the answer's `tool_calls` (streamed and not), and the 400s naming the param."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient

from gateway.api.app import build_app
from gateway.cluster.readiness import Readiness
from gateway.config import GatewayConfig
from gateway.serving.core import GatewayCore
from gateway.serving.metrics import GatewayMetrics
from omnistream.request.generation import AudioEvent, DoneEvent, GenerationRequest, TextEvent
from omnistream.request.spoken import calls_only
from tests.unit.gateway.infos import deployment

STAGES = {"thinker": ["a:1"], "talker": ["b:1"], "code2wav": ["c:1"]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ASK = [{"role": "user", "content": "Weather in Paris?"}]


class _Session:
    request_id = "r1"

    def __init__(self, deltas: list[str], audio: bool, finish: str = "stop") -> None:
        self.deltas, self.audio, self.finish = deltas, audio, finish

    async def events(self):
        for delta in self.deltas:
            yield TextEvent([1], delta)
        if self.audio:
            yield AudioEvent(np.zeros(240, np.float32), 0, 24000)
        yield DoneEvent([1, 2], [3] * len(self.deltas), self.finish, 0, 0, None, None, 0.1)

    async def aclose(self) -> None:
        pass


class ScriptedCore(GatewayCore):
    """The real validation; the model's answer is `deltas` (audio after it when it has words)."""

    def __init__(self) -> None:
        self.config = GatewayConfig(**STAGES)
        self.deployment = deployment()
        self.metrics = GatewayMetrics()
        self.replicas = SimpleNamespace(snapshot=lambda: {})
        self.opened: list[GenerationRequest] = []
        self.deltas: list[str] = []
        self.finish = "stop"  # "length": the answer was cut at max_tokens

    @property
    def readiness(self) -> Readiness:
        return Readiness.of(lambda stage: True)

    async def open(self, request, request_id=None, timeout=None, trace=None):
        self.validate(request)
        self.opened.append(request)
        # Spoken when it has words and its grammar allows them (the thinker's filter, issue 59).
        words = any(not d.startswith("<tool_call>") for d in self.deltas) and not calls_only(
            request.structured_output
        )
        return _Session(self.deltas, request.return_audio and words, self.finish)


@pytest.fixture
def sdk():
    core = ScriptedCore()
    with TestClient(build_app(core), raise_server_exceptions=False) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http), core


def test_tools_and_calls_reach_the_request_in_the_models_form(sdk):
    client, core = sdk
    core.deltas = ["It is sunny."]
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    answer = client.chat.completions.create(
        model="m",
        messages=history,
        tools=[WEATHER],
        tool_choice="auto",
        parallel_tool_calls=False,
        modalities=["text"],
    )
    assert answer.choices[0].message.content == "It is sunny." and answer.choices[0].finish_reason == "stop"
    request = core.opened[0]
    assert request.tools == [WEATHER] and request.structured_output is None
    assert request.messages[1] == {"role": "assistant", "content": "", "tool_calls": history[1]["tool_calls"]}
    assert request.messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


@pytest.mark.parametrize("audio", [False, True])
def test_a_call_is_message_tool_calls_streamed_and_not(sdk, audio):
    client, core = sdk
    core.deltas = ["Let me look.\n", *(CALL_TEXT[i : i + 7] for i in range(0, len(CALL_TEXT), 7))]
    options = (
        {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "pcm16"}}
        if audio
        else {"modalities": ["text"]}
    )
    whole = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], **options)
    (call,) = whole.choices[0].message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
        "function",
        "get_weather",
        {"city": "Paris"},
    )
    assert call.id.startswith("call_") and whole.choices[0].finish_reason == "tool_calls"
    said = whole.choices[0].message.audio.transcript if audio else whole.choices[0].message.content
    assert said == "Let me look."
    chunks = list(
        client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], stream=True, **options)
    )
    pieces = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
    assert (
        pieces[0].index == 0 and pieces[0].id.startswith("call_") and pieces[0].function.name == "get_weather"
    )
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_an_answer_that_is_only_a_call_has_no_content_and_no_audio(sdk):
    client, core = sdk
    core.deltas = [CALL_TEXT]
    answer = client.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER], tool_choice="required", modalities=["text", "audio"]
    )
    message = answer.choices[0].message
    assert message.content is None and message.audio is None and len(message.tool_calls) == 1
    grammar = core.opened[0].structured_output
    assert grammar.kind == "structural_tag" and "get_weather" in grammar.spec


def _answer(client, stream: bool, **request):
    """(content, [(name, arguments)], audio, finish_reason) of a whole answer, or the same assembled
    from a stream's chunks as a client does (audio: any `delta.audio`)."""
    request = {"model": "m", "messages": ASK, **request}
    if not stream:
        choice = client.chat.completions.create(**request).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()]
        return choice.message.content, calls, choice.message.audio, choice.finish_reason
    content, calls, audio, finish = None, {}, None, None
    for chunk in client.chat.completions.create(stream=True, **request):
        delta = chunk.choices[0].delta
        if delta.content:
            content = (content or "") + delta.content
        audio = audio or getattr(delta, "audio", None)
        for piece in delta.tool_calls or ():
            if piece.id is not None:
                calls[piece.index] = [piece.function.name, ""]
            calls[piece.index][1] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], audio, finish


CALL_CUT = CALL_TEXT[: CALL_TEXT.index("Paris") + 2]
CUT = {  # what the grammar made when max_tokens cut it -> the calls reported
    "arguments": ([CALL_CUT], [("get_weather", '{"city": "Pa')]),
    "second call": (
        [CALL_TEXT, "\n", CALL_CUT],
        [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Pa')],
    ),
    "marker": (["<tool_ca"], []),
    "name": ([CALL_TEXT[: CALL_TEXT.index("get_")]], []),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("modalities", [["text"], ["text", "audio"]], ids=["text", "audio"])
@pytest.mark.parametrize("cut", sorted(CUT))
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_cut_by_max_tokens_is_reported_as_a_cut(sdk, cut, modalities, stream, choice):
    """Issue 59: `finish_reason` "length" with the calls that were made, the cut one with its
    arguments so far; a call cut before its name is not one. No words, nothing spoken (the cut
    open marker "<tool_ca" was content and was spoken)."""
    client, core = sdk
    deltas, calls = CUT[cut]
    core.deltas, core.finish = [d[i : i + 5] for d in deltas for i in range(0, len(d), 5)], "length"
    audio = {"audio": {"voice": "ethan", "format": "pcm16"}} if "audio" in modalities else {}
    answer = _answer(
        client, stream, tools=[WEATHER], tool_choice=choice, modalities=modalities, max_tokens=9, **audio
    )
    assert answer == (None, calls, None, "length")


def test_a_named_function_is_enforced_by_a_grammar(sdk):
    client, core = sdk
    core.deltas = [CALL_TEXT]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    answer = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice=choice)
    assert answer.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert json.loads(core.opened[0].structured_output.spec)["format"]["type"] == "tag"


def test_a_json_schema_answer_is_text_only_and_enforced(sdk):
    client, core = sdk
    core.deltas = ['{"ok": true}']
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    answer = client.chat.completions.create(
        model="m",
        messages=ASK,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
    )
    assert json.loads(answer.choices[0].message.content) == {"ok": True}
    request = core.opened[0]
    assert request.return_audio is False  # JSON is not spoken
    assert (
        request.structured_output.kind == "json_schema"
        and json.loads(request.structured_output.spec) == schema
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": [{**WEATHER, "function": {"name": "f", "parameters": {"type": 5}}}]},
            "tools.0.function.parameters",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        (
            {"messages": [*ASK, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
            "messages.1.tool_call_id",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {"type": "nope"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
    ],
)
def test_values_that_do_not_hold_together_are_400s_naming_the_param(sdk, fields, param):
    client, core = sdk
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", **({"messages": ASK} | fields))
    assert caught.value.status_code == 400 and caught.value.body["param"] == param
    assert core.opened == []  # refused before anything ran


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "tool", "content": "x"}, "messages.0.tool_call_id"),
        ({"role": "user", "content": None}, "messages.0.content"),
        ({"role": "user"}, "messages.0.content"),
        ({"role": "user", "content": "x", "tool_calls": []}, "messages.0.tool_calls"),
        ({"role": "system", "content": "x", "tool_call_id": "c"}, "messages.0.tool_call_id"),
        ({"role": "assistant"}, "messages.0"),
        ({"role": "robot", "content": "x"}, "messages.0.role"),
        ({"content": "x"}, "messages.0.role"),
    ],
)
def test_message_shapes_of_each_role_are_checked_naming_the_field(sdk, message, param):
    client, core = sdk
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.chat.completions.create(model="m", messages=[message])
    assert caught.value.body["param"] == param
    assert core.opened == []


def test_a_function_name_outside_the_pattern_is_refused_naming_it(sdk):
    client, _ = sdk
    tools = [{**WEATHER, "function": {"name": "no spaces"}}]
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.chat.completions.create(model="m", messages=ASK, tools=tools)
    assert caught.value.body["param"] == "tools.0.function.name"
