"""A schema the output grammar enforces (a json_schema response format, the functions of a forced
call) may say only what the grammar enforces: what xgrammar leaves unenforced
(tests/json_schemas.py UNENFORCED_CASES, shown there to let invalid answers through) is a 400 naming
the client's param and where in the schema; the schemas the grammar property tests generate, and
anything under `auto`, are taken."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from gateway.tools.spec import Function, Named, check_enforceable, response_format_output, tool_use
from omnistream.request.errors import InvalidValue
from tests.json_schemas import UNENFORCED_CASES, as_parameters, schemas

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("keyword", "schema", "invalid"), UNENFORCED_CASES, ids=[c[0] for c in UNENFORCED_CASES]
)
def test_what_the_grammar_cannot_enforce_is_refused_naming_the_param(keyword, schema, invalid):
    with pytest.raises(InvalidValue) as caught:
        response_format_output("json_schema", schema)
    assert caught.value.field == "response_format.json_schema.schema"
    assert "cannot enforce" in caught.value.message
    nested = {"type": "object", "properties": {"x": {"type": "array", "items": schema}}, "required": ["x"]}
    functions = [
        Function("f", parameters=nested, param="tools.0.function"),
        Function("g", param="tools.1.function"),
    ]
    for choice in ("required", Named("f")):
        with pytest.raises(InvalidValue) as caught:
            tool_use(functions, choice)
        assert caught.value.field == "tools.0.function.parameters"
        assert "(at properties/x/items" in caught.value.message
    # Nothing is enforced under auto, nor for a function a named choice leaves out.
    assert tool_use(functions, "auto").structured_output is None
    assert tool_use(functions, Named("g")).structured_output is not None


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(schemas())
def test_the_schemas_the_grammar_enforces_are_taken(schema):
    check_enforceable(schema, "p")
    assert (
        tool_use([Function("f", parameters=as_parameters(schema))], "required").structured_output is not None
    )


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "multipleOf": 5},  # unbounded integer by an integer: enforced
        {"allOf": [{"type": "string"}]},
        {"oneOf": [{"type": "integer"}]},
        {"type": "string", "enum": ["a", "b"]},
        {"$defs": {"n": {"type": "integer"}}, "anyOf": [{"$ref": "#/$defs/n"}], "enum": [1, 2]},
        {"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": {"maxLength": 3}},
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": False},
    ],
)
def test_what_the_grammar_enforces_is_taken(schema):
    check_enforceable(schema, "p")
