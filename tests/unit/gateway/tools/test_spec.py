"""What tools, tool_choice and response_format become: the prompt's tools, the grammar, the parsing;
the 400s naming the param; and (with xgrammar installed) that the grammars accept exactly the
calls they mean."""

from __future__ import annotations

import json

import pytest

from gateway.tools.spec import (
    Function,
    Named,
    ToolUse,
    call_begin,
    response_format_output,
    tool_use,
)
from omnistream.request.errors import STATUS_TABLE, InvalidValue
from omnistream.request.structured import MAX_SPEC_BYTES

WEATHER = Function(
    "get_weather",
    "The weather in a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"],
    },
    param="tools.0.function",
)
TIME = Function("get_time", param="tools.1.function")  # no parameters: no arguments


def call(name: str, arguments: str) -> str:
    return f"{call_begin(name)}{arguments}}}\n</tool_call>"


def test_auto_offers_the_tools_enforces_nothing_and_parses_calls():
    use = tool_use([WEATHER, TIME])
    assert use.structured_output is None and use.parse_calls and not use.enforced_calls
    assert use.names == {"get_weather", "get_time"}
    assert use.prompt_tools() == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER.description,
                "parameters": WEATHER.parameters,
            },
        },
        {"type": "function", "function": {"name": "get_time"}},
    ]


def test_none_and_no_tools_offer_nothing_and_parse_nothing():
    for use in (tool_use([WEATHER], "none"), tool_use([])):
        assert use == ToolUse() and use.prompt_tools() is None


def test_required_is_only_calls_of_the_offered_functions():
    use = tool_use([WEATHER, TIME], "required")
    assert use.parse_calls and use.enforced_calls and use.structured_output is not None
    assert use.structured_output.kind == "structural_tag"
    grammar = json.loads(use.structured_output.spec)["format"]
    assert grammar["type"] == "tags_with_separator" and grammar["at_least_one"] is True
    assert grammar["stop_after_first"] is False
    begins = [t["begin"] for t in grammar["tags"]]
    assert begins == [
        '<tool_call>\n{"name": "get_weather", "arguments": ',
        '<tool_call>\n{"name": "get_time", "arguments": ',
    ]
    assert grammar["tags"][0]["content"]["json_schema"] == WEATHER.parameters
    assert grammar["tags"][1]["content"]["json_schema"] == {"type": "object", "properties": {}}
    assert {t["end"] for t in grammar["tags"]} == {"}\n</tool_call>"}
    single = json.loads(tool_use([WEATHER], "required", parallel_tool_calls=False).structured_output.spec)
    assert single["format"]["stop_after_first"] is True


def test_a_named_function_is_one_call_of_it():
    use = tool_use([WEATHER, TIME], Named("get_time"))
    assert use.names == {"get_time"} and len(use.offered) == 2  # all stay in the prompt
    grammar = json.loads(use.structured_output.spec)["format"]
    assert grammar["type"] == "tag" and grammar["begin"] == call_begin("get_time")


@pytest.mark.parametrize(
    ("functions", "choice", "param"),
    [
        ([WEATHER], Named("get_news"), "tool_choice"),
        ([], "required", "tool_choice"),
        ([Function("bad name!", param="tools.0.function")], "auto", "tools.0.function.name"),
        ([WEATHER, Function("get_weather", param="tools.1.function")], "auto", "tools.1.function.name"),
        (
            [Function("f", parameters={"type": "objekt"}, param="tools.0.function")],
            "auto",
            "tools.0.function.parameters",
        ),
        (
            [Function("f", parameters={"properties": []}, param="tools.0.function")],
            "auto",
            "tools.0.function.parameters",
        ),
        (
            [Function("f", parameters={"$schema": {"a": 1}}, param="tools.0.function")],
            "auto",
            "tools.0.function.parameters",
        ),
    ],
)
def test_bad_tools_are_400s_naming_the_param(functions, choice, param):
    with pytest.raises(InvalidValue) as caught:
        tool_use(functions, choice)
    assert caught.value.field == param
    assert STATUS_TABLE[caught.value.kind].http_status == 400


def test_response_formats():
    assert response_format_output("text") is None
    assert response_format_output("json_object").kind == "json_object"
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    out = response_format_output("json_schema", schema)
    assert out.kind == "json_schema" and json.loads(out.spec) == schema
    assert json.loads(response_format_output("json_schema").spec) == {}
    with pytest.raises(InvalidValue) as caught:
        response_format_output("json_schema", {"type": 3})
    assert caught.value.field == "response_format.json_schema.schema"


def test_response_format_goes_with_auto_but_not_with_a_forced_call():
    fmt = response_format_output("json_object")
    auto = tool_use([WEATHER], "auto", response_format=fmt)
    assert auto.structured_output == fmt and not auto.parse_calls  # the answer is JSON, not calls
    for choice in ("required", Named("get_weather")):
        with pytest.raises(InvalidValue) as caught:
            tool_use([WEATHER], choice, response_format=fmt)
        assert caught.value.field == "response_format"


def test_a_grammar_too_large_is_refused_naming_its_param():
    huge = Function(
        "f", parameters={"type": "object", "description": "x" * MAX_SPEC_BYTES}, param="tools.0.function"
    )
    with pytest.raises(InvalidValue) as caught:
        tool_use([huge], "required")
    assert caught.value.field == "tools"
    with pytest.raises(InvalidValue) as caught:
        response_format_output("json_schema", {"description": "x" * MAX_SPEC_BYTES})
    assert caught.value.field == "response_format"


def _accepts(spec: str, text: str) -> bool:
    xgrammar = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    return _is_grammar_accept_string(xgrammar.Grammar.from_structural_tag(spec), text)


def test_the_required_grammar_takes_calls_only():
    spec = tool_use([WEATHER, TIME], "required").structured_output.spec
    paris, now = call("get_weather", '{"city": "Paris"}'), call("get_time", "{}")
    assert _accepts(spec, paris) and _accepts(spec, f"{paris}\n{now}")
    assert not _accepts(spec, "")  # at least one
    assert not _accepts(spec, f"Sure. {paris}")  # only calls
    assert not _accepts(spec, call("get_weather", '{"city": "Oslo"}'))  # arguments follow the schema
    assert not _accepts(spec, call("get_news", "{}"))  # offered functions only
    single = tool_use([WEATHER, TIME], "required", parallel_tool_calls=False).structured_output.spec
    assert _accepts(single, paris) and not _accepts(single, f"{paris}\n{now}")


def test_the_named_grammar_takes_one_call_of_it():
    spec = tool_use([WEATHER, TIME], Named("get_weather")).structured_output.spec
    assert _accepts(spec, call("get_weather", '{"city": "Rome"}'))
    assert not _accepts(spec, call("get_time", "{}"))
    assert not _accepts(spec, call("get_weather", "{}"))  # city is required


def test_the_thinker_reads_a_forced_calls_grammar_as_calls_alone():
    """What omnistream/request/spoken.py leaves unspoken whole (issue 59: a cut open marker was
    spoken): the grammars of `required` and a named function, not those with words."""
    from omnistream.request.spoken import calls_only

    for parallel in (True, False):
        assert calls_only(tool_use([WEATHER, TIME], "required", parallel).structured_output)
        assert calls_only(tool_use([WEATHER, TIME], Named("get_time"), parallel).structured_output)
    assert not calls_only(tool_use([WEATHER], "auto").structured_output)
    json_answer = tool_use([WEATHER], response_format=response_format_output("json_object"))
    assert not calls_only(json_answer.structured_output)
