"""Tool calls and structured output in chat completions, with the official openai SDK unmodified,
against `omnistream up` on the tiny model, on each thinker backend (vLLM where .venv-vllm exists).

`required`, a named function and `json_schema` are enforced by the thinker's grammar, so they hold
on the random tiny model: the arguments validate against the tool's schema. `auto` parses what the
model writes, and a tool result is in the next answer's prompt. Bad values are 400s naming `param`.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.integration.test_up import SERVING, run_up
from tests.vllm_env import requires_vllm

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "celsius": {"type": "boolean"},
    },
    "required": ["city", "celsius"],
    "additionalProperties": False,
}
TIME_SCHEMA = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Today's weather.", "parameters": WEATHER_SCHEMA},
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "The time now.", "parameters": TIME_SCHEMA},
    },
]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "seed": 1, "max_tokens": 64}


@pytest.fixture(scope="module", params=["transformers", pytest.param("vllm", marks=requires_vllm)])
def client(request, ending_tiny_model_dir, tmp_path_factory):
    """An `omnistream up` stack on ephemeral ports (always stopped), and an SDK client of it."""
    flags = ["--http-port", "0", "--grpc-port", "0", "--thinker-backend", request.param]
    with run_up(tmp_path_factory.mktemp(f"up-{request.param}"), ending_tiny_model_dir, *flags) as up:
        match, _ = up.wait_for(SERVING, timeout=300)
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{match.group(1)}/v1", api_key="none", timeout=120)


def checked_calls(message, cut: bool = False) -> list[tuple[str, dict]]:
    """Each call's name and arguments; the arguments validate against its function's schema.
    `cut` (finish_reason "length"): the last call may be unfinished (its arguments cut short)."""
    calls = []
    for i, call in enumerate(message.tool_calls or ()):
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in SCHEMAS
        try:
            arguments = json.loads(call.function.arguments)
        except ValueError:
            if cut and i == len(message.tool_calls) - 1:
                continue
            raise
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        calls.append((call.function.name, arguments))
    return calls


def streamed(client, **kwargs):
    """A streamed answer as the SDK's chunks: (text, the calls' (name, arguments) assembled from
    delta.tool_calls, finish_reason)."""
    text, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for piece in delta.tool_calls or ():
            if piece.id is not None:  # the first piece of a call: its id, type and name
                assert piece.index not in calls and piece.function.name
                calls[piece.index] = [piece.function.name, piece.function.arguments or ""]
            else:
                calls[piece.index][1] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return text, [tuple(calls[i]) for i in sorted(calls)], finish


def test_required_is_only_calls_with_valid_arguments_and_no_audio(client):
    one = client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
        modalities=["text", "audio"], **GREEDY,
    ).choices[0]  # fmt: skip
    assert one.finish_reason == "tool_calls" and len(checked_calls(one.message)) == 1
    assert one.message.content is None and one.message.audio is None  # a call is not spoken
    # parallel calls (the default): one or more, only calls (the random model may go on to the limit)
    some = client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice="required", modalities=["text"], **GREEDY
    ).choices[0]
    assert some.finish_reason in ("tool_calls", "length") and some.message.content is None
    assert checked_calls(some.message, cut=some.finish_reason == "length")


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}], ids=["required", "named"]
)
def test_streamed_pieces_joined_are_the_whole_answer(client, choice):
    request = {
        "model": "m",
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": choice,
        "modalities": ["text"],
        **GREEDY,
    }
    whole = client.chat.completions.create(**request).choices[0]
    calls = checked_calls(whole.message, cut=whole.finish_reason == "length")
    if isinstance(choice, dict):
        assert [name for name, _ in calls] == ["get_time"]
    raw = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert streamed(client, **request) == (whole.message.content or "", raw, whole.finish_reason)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}], ids=["required", "named"]
)
def test_a_forced_call_cut_by_max_tokens_is_reported_with_what_was_made(client, choice):
    """Issue 59: a forced call ends the answer with its call (`parallel_tool_calls: false`: one,
    then the end); cut by `max_tokens` it is `finish_reason: "length"` with the call as made so
    far (its arguments a beginning of the whole ones), streamed and not alike; cut before its
    name, no call, no words, nothing spoken."""
    request = {"model": "m", "messages": ASK, "tools": TOOLS, "tool_choice": choice}
    request["parallel_tool_calls"] = False
    whole = client.chat.completions.create(modalities=["text"], **request, **GREEDY)
    (call,) = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls" and checked_calls(whole.choices[0].message)
    # A few tokens short of the end: inside the arguments (the call's closing and the end of turn
    # are 4 tokens).
    cut_at = {**GREEDY, "max_tokens": whole.usage.completion_tokens - 8}
    cut = client.chat.completions.create(modalities=["text"], **request, **cut_at).choices[0]
    assert cut.finish_reason == "length" and cut.message.content is None
    (made,) = cut.message.tool_calls
    assert made.function.name == call.function.name
    assert call.function.arguments.startswith(made.function.arguments) and made.function.arguments
    assert made.function.arguments != call.function.arguments
    raw = [(made.function.name, made.function.arguments)]
    assert streamed(client, modalities=["text"], **request, **cut_at) == ("", raw, "length")
    # Cut before the call's name came: a cut answer of nothing, not even spoken.
    short = {**GREEDY, "max_tokens": 6}
    before = client.chat.completions.create(modalities=["text", "audio"], **request, **short).choices[0]
    assert before.finish_reason == "length" and before.message.tool_calls is None
    assert before.message.content is None and before.message.audio is None
    assert streamed(client, modalities=["text"], **request, **short) == ("", [], "length")


def test_json_schema_output_validates(client):
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": False,
    }
    answer = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Is the sea blue?"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": schema, "strict": True},
        },
        **GREEDY,
    )
    message = answer.choices[0].message
    jsonschema.validate(json.loads(message.content), schema)
    assert message.audio is None  # JSON answers are text


def test_a_tool_result_leads_to_an_answer_that_read_it(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    first = (
        client.chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, tool_choice=named, modalities=["text"], **GREEDY
        )
        .choices[0]
        .message
    )
    (call,) = first.tool_calls
    turn = {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]}

    def answer(result: str):
        history = [*ASK, turn, {"role": "tool", "tool_call_id": call.id, "content": result}]
        return client.chat.completions.create(
            model="m", messages=history, tools=TOOLS, modalities=["text"], **GREEDY
        )

    short, long = answer("sunny"), answer("sunny and warm all day, " * 8)
    assert short.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert short.choices[0].message.content or short.choices[0].message.tool_calls
    checked_calls(short.choices[0].message)  # auto: whatever it called is well formed
    assert long.usage.prompt_tokens > short.usage.prompt_tokens  # the result is in the prompt


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}]},
            "tools.0.function.parameters",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_news"}}},
            "tool_choice",
        ),
        (
            {"messages": [*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "1"}]},
            "messages.1.tool_call_id",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"description": "x" * 70_000}},
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
        ),
        (  # a JSON schema the gateway accepts but the thinker's grammar compiler cannot build
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "w", "schema": {"type": "string", "pattern": "(?<=a)b"}},
                }
            },
            "response_format",
        ),
    ],
)
def test_bad_values_are_400s_naming_the_param(client, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", **({"messages": ASK, "max_tokens": 8} | fields))
    assert caught.value.body["param"] == param
    # and the stack serves on
    assert client.chat.completions.create(model="m", messages=ASK, modalities=["text"], **GREEDY).choices
