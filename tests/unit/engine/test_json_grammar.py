"""The strict JSON grammars both thinkers give xgrammar (omnistream/engine/json_grammar.py), over
generated schemas (tests/json_schemas.py): every valid instance's compact JSON is taken, and every
text the grammar itself makes (random walks through it, byte by byte) is strict compact JSON
(no raw control character, no whitespace between tokens) that validates once it ends; the same
for tool calls' structural tags; the cases of xgrammar's own grammars that were not strict; what
xgrammar does not enforce (which the gateway refuses); and the same checks on the vLLM
environment's xgrammar (another version)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import xgrammar as xgr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xgrammar.testing import _is_grammar_accept_string

from gateway.tools.spec import CALL_END, Function, Named, call_begin, tool_use
from omnistream.engine.json_grammar import (
    json_object_ebnf,
    json_schema_ebnf,
    strict_grammar,
    strict_structural_tag,
)
from tests.json_schemas import (
    UNENFORCED_CASES,
    NotInGrammar,
    answer_problems,
    as_parameters,
    byte_tokenizer,
    byte_walks,
    calls_of,
    compact,
    in_schema_order,
    instances,
    schemas,
    separators_at,
)
from tests.vllm_env import VLLM_PYTHON, requires_vllm

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
# Derandomized: the same schemas every run (a failure is reproduced by running the test again).
PROPERTY = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(byte_tokenizer(), max_threads=1)


def accepts(ebnf: str, text: str) -> bool:
    return _is_grammar_accept_string(xgr.Grammar.from_ebnf(ebnf), text)


def validator(schema: object) -> jsonschema.protocols.Validator:
    return jsonschema.validators.validator_for(schema)(schema)


@PROPERTY
@given(st.data())
def test_a_valid_answer_is_taken_as_compact_json_and_nothing_looser(data):
    schema = data.draw(schemas(), label="schema")
    ebnf = json_schema_ebnf(schema)
    instance = data.draw(instances(schema), label="instance")
    check = validator(schema)
    assert check.is_valid(instance)
    try:
        text = compact(in_schema_order(instance, schema, check))
    except NotInGrammar:
        return
    assert accepts(ebnf, text), text
    # Whitespace after the first separator (outside strings), a raw control character in the
    # first string: never strict JSON, never taken.
    separator = next(iter(separators_at(text)), None)
    if separator is not None:
        for blank in (" ", "\t", "\n", "\r"):
            assert not accepts(ebnf, text[: separator + 1] + blank + text[separator + 1 :])
    if '"' in text:
        start = text.index('"') + 1
        for control in ("\x1b", "\t", "\x00", "\n"):
            assert not accepts(ebnf, text[:start] + control + text[start:])


@PROPERTY
@given(schemas())
def test_every_text_a_grammar_makes_is_strict_json_that_validates(compiler, schema):
    compiled = compiler.compile_grammar(json_schema_ebnf(schema))
    walks = byte_walks(compiled, seed=len(json.dumps(schema)), walks=4)
    for raw, ended in walks:
        assert not answer_problems(raw, ended, schema), (schema, raw)
    assert any(ended for _, ended in walks)


@settings(PROPERTY, max_examples=80)
@given(st.lists(schemas(), min_size=1, max_size=3), st.sampled_from(["named", "required", "required-one"]))
def test_every_call_a_tool_grammar_makes_has_strict_arguments_that_validate(compiler, parameters, choice):
    functions = [Function(f"f{i}", parameters=as_parameters(p)) for i, p in enumerate(parameters)]
    by_name = {f.name: f.parameters for f in functions}
    use = tool_use(functions, Named("f0") if choice == "named" else "required", choice == "required")
    assert use.structured_output is not None
    compiled = compiler.compile_structural_tag(strict_structural_tag(use.structured_output.spec))
    for raw, ended in byte_walks(compiled, seed=len(parameters), walks=3, limit=600):
        if not ended:
            continue
        calls = calls_of(raw.decode("utf-8"))
        assert (len(calls) == 1) if choice != "required" else (len(calls) >= 1), (choice, raw)
        for name, arguments in calls:
            assert not answer_problems(arguments.encode(), True, by_name[name]), (name, arguments)


# --- the cases that were not strict ------------------------------------------------------------------
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 24}},
    "required": ["answer"],
}


STRICT_CASES = [
    # issue 59: xgrammar's length-bounded string took a raw ESC (and no escape at all)
    (ANSWER, ['{"answer":"a\\u001bb"}', '{"answer":"say \\"hi\\"\\n"}'], ['{"answer":"a\x1bb"}']),
    ({"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 2}}, ['["\\t"]'], ['["\t"]']),
    (
        {"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": {"maxLength": 3}},
        ['{"a\\tb":1}'],
        ['{"a\tb":1}'],
    ),
    # a pattern naming a control character, a quote or a backslash: written escaped
    ({"type": "string", "pattern": "^a\\tb$"}, ['"a\\tb"'], ['"a\tb"']),
    ({"type": "string", "pattern": "^[\\x01-\\x1f]$"}, ['"\\u001b"', '"\\n"'], ['"\x1b"', '"\n"']),
    ({"type": "string", "pattern": '^a"b$'}, ['"a\\"b"'], ['"a"b"']),
    ({"type": "string", "pattern": "^.{1,2}$"}, ['"\\\\"', '"é\\u0000"'], ['"\x00"', '"\\"']),
    # the surrogate escape of half a character does not count as one of a bounded string's
    ({"type": "string", "minLength": 1, "maxLength": 1}, ['"\\u00e9"'], ['"\\ud83d"']),
    # compact: no blank anywhere between tokens, in a free value too
    ({}, ['{"a":[1,{"b":null}]}'], ['{"a": 1}', "[1, 2]", '{"a":1 }', " 1"]),
]


@pytest.mark.parametrize(("schema", "taken", "refused"), STRICT_CASES)
def test_what_xgrammar_let_through_is_refused_and_the_json_form_taken(schema, taken, refused):
    ebnf = json_schema_ebnf(schema)
    for text in taken:
        assert accepts(ebnf, text), text
    for text in refused:
        assert not accepts(ebnf, text), text


def test_a_tool_calls_arguments_take_no_whitespace():
    """issue 59: the call grammar's json_schema content took `max_whitespace_cnt` blanks (tabs, `\\r`,
    blank lines) between the arguments' tokens: a weak model spent its tokens there."""
    weather = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
    }
    spec = tool_use([Function("get_weather", parameters=weather)], Named("get_weather")).structured_output
    assert spec is not None and '"max_whitespace_cnt"' in spec.spec  # the gateway's spec, as sent
    grammar = xgr.Grammar.from_structural_tag(strict_structural_tag(spec.spec))
    begin = call_begin("get_weather")
    assert _is_grammar_accept_string(grammar, begin + '{"city":"Paris"}' + CALL_END)
    for loose in ('{\t"city"\r: "Paris"}', '{"city": "Paris"}', '{"city":"Paris"}\n\n', '{"city":"a\x1b"}'):
        assert not _is_grammar_accept_string(grammar, begin + loose + CALL_END), loose


def test_every_json_content_of_a_structural_tag_is_made_strict_however_deep():
    integer = {"type": "json_schema", "json_schema": {"type": "array", "items": {"type": "integer"}}}
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "sequence",
            "elements": [
                {"type": "const_string", "value": "<a>"},
                {
                    "type": "or",
                    "elements": [integer, {"type": "tag", "begin": "[", "content": integer, "end": "]"}],
                },
            ],
        },
    }
    strict = json.loads(strict_structural_tag(json.dumps(tag)))
    assert '"json_schema"' not in json.dumps(strict) and strict["format"]["elements"][0]["value"] == "<a>"
    grammar = xgr.Grammar.from_structural_tag(json.dumps(strict))
    assert _is_grammar_accept_string(grammar, "<a>[1,2]") and _is_grammar_accept_string(grammar, "<a>[[3]]")
    assert not _is_grammar_accept_string(grammar, "<a>[1, 2]")
    legacy = {  # xgrammar's older form: the same triggered tags
        "type": "structural_tag",
        "structures": [{"begin": "<n>", "schema": {"type": "integer"}, "end": "</n>"}],
        "triggers": ["<n>"],
    }
    grammar = xgr.Grammar.from_structural_tag(strict_structural_tag(json.dumps(legacy)))
    assert _is_grammar_accept_string(grammar, "so <n>42</n> it is")
    assert not _is_grammar_accept_string(grammar, "<n> 42</n>")
    with pytest.raises(ValueError, match="excludes"):
        strict_structural_tag(
            json.dumps({"type": "structural_tag", "format": {**integer, "excludes": ["x"]}})
        )


def test_the_kinds_of_a_structured_output():
    assert strict_grammar("json_object", "") == json_object_ebnf()
    assert accepts(json_object_ebnf(), '{"a":[1]}') and not accepts(json_object_ebnf(), "[1]")
    assert strict_grammar("json_schema", '{"type": "integer"}') == json_schema_ebnf({"type": "integer"})
    with pytest.raises(ValueError, match="object or a boolean"):
        strict_grammar("json_schema", "[1]")
    with pytest.raises(ValueError, match="unknown"):
        strict_grammar("regex", "a+")


# --- what xgrammar does not enforce ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("keyword", "schema", "invalid"), UNENFORCED_CASES, ids=[c[0] for c in UNENFORCED_CASES]
)
def test_what_xgrammar_does_not_enforce(keyword, schema, invalid):
    """Each of these takes an answer that fails its schema (so the gateway refuses the keyword:
    gateway/tools/spec.py `check_enforceable`). If xgrammar starts enforcing one, this fails: the
    keyword can then be taken."""
    assert not validator(schema).is_valid(invalid)
    assert accepts(json_schema_ebnf(schema), compact(invalid))


# --- the vLLM environment's xgrammar -----------------------------------------------------------------
@requires_vllm
@settings(PROPERTY, max_examples=1)
@given(st.data())
def test_the_vllm_environments_xgrammar_gets_the_same_strict_grammars(data):
    """The vLLM thinker builds its grammars with its own environment's xgrammar (0.2.8 where this
    one is 0.2.9, whose free arrays and objects take `", "`): the same checks there, over 40
    generated schemas, the cases above and a tool call's tag (tests/json_grammar_check.py)."""
    checks = []
    for _ in range(40):
        schema = data.draw(schemas())
        instance = data.draw(instances(schema))
        try:
            text = compact(in_schema_order(instance, schema, validator(schema)))
        except NotInGrammar:
            continue
        checks.append({"schema": schema, "taken": [text], "refused": []})
    for schema, taken, refused in STRICT_CASES:
        checks.append({"schema": schema, "taken": taken, "refused": refused})
    weather = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
    }
    spec = tool_use([Function("f", parameters=weather)], Named("f")).structured_output
    assert spec is not None
    begin = call_begin("f")
    tag = {
        "tag": spec.spec,
        "schema": weather,
        "taken": [begin + '{"city":"a\\u001b"}' + CALL_END],
        "refused": [begin + '{"city": "a"}' + CALL_END, begin + '{"city":"a\x1b"}' + CALL_END],
    }
    payload = json.dumps({"schemas": checks, "tags": [tag]})
    result = subprocess.run(
        [VLLM_PYTHON, "-m", "tests.json_grammar_check"],
        input=payload,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["problems"] == [], report["problems"][:5]
    assert report["walks"] >= 4 * len(checks) and report["ended"] > report["walks"] // 2
