"""What a request's tools, tool choice and response format mean for one answer: the tools its prompt
offers, the grammar its output must follow (`StructuredOutput`), and whether its text is searched
for calls. The REST chat and the realtime session both map their own JSON onto these few types.

Decisions, as OpenAI and vLLM make them:

* `auto`: the tools are in the prompt, nothing is enforced; the calls the model writes (Qwen3's
  `<tool_call>` format) are parsed out of its text, and what does not parse stays text.
* `none`: the model may not call. The tools are left out of the prompt (vLLM's default), so the
  model is not invited to write calls; the text is not parsed.
* `required`: at least one call, and only calls (no words around them), each of an offered function
  with arguments that validate against its `parameters`; one call only unless
  `parallel_tool_calls`. A named function: exactly one call of it. Both are enforced by the
  thinker's grammar (a structural tag), so they hold on any checkpoint.
* `response_format`: `json_schema` (its `schema`, `{}` when absent) and `json_object` are enforced
  too; `text` is free text. `strict` is accepted either way: every grammar here is enforced
  strictly. It cannot be combined with `required` or a named function (one grammar per answer): a
  400 on `response_format`.
* A function's `parameters` must be a JSON schema (checked with `jsonschema`'s `check_schema`);
  absent, the function takes no arguments (`{"type": "object", "properties": {}}`), as OpenAI says.
* A schema the grammar enforces (a `json_schema` response format, the functions a forced call may
  name) may use only what the grammar can enforce (`check_enforceable`): a keyword xgrammar
  ignores would let an enforced answer fail its schema, so it is refused, as OpenAI's strict
  structured outputs refuse the keywords they do not support. Under `auto` nothing is enforced
  and any schema is taken.

Every refusal here is `InvalidValue` (HTTP 400) naming the client's parameter.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema  # type: ignore[import-untyped]  # no stubs installed (types-jsonschema)
from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]

from omnistream.request.errors import InvalidValue
from omnistream.request.structured import (
    MAX_SPEC_BYTES,
    SUBSCHEMA_LIST,
    SUBSCHEMA_MAP,
    SUBSCHEMA_ONE,
    StructuredOutput,
)

NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}
# A call as Qwen3 writes it (its chat template's format): the grammar's tag around the arguments.
CALL_START = "<tool_call>"
CALL_END_TAG = "</tool_call>"
CALL_END = "}\n" + CALL_END_TAG
# Runs of blanks between JSON tokens in enforced arguments: bounded, so a model cannot fill its
# budget with whitespace inside a call (a real model writes single spaces).
MAX_WHITESPACE = 2

Choice = Literal["auto", "none", "required"]


def call_begin(name: str) -> str:
    """What a call of `name` starts with, up to its arguments."""
    return f'{CALL_START}\n{{"name": "{name}", "arguments": '


@dataclass(frozen=True)
class Function:
    """One function tool, whatever API it came through. `param`: where it sits in the client's
    request (`tools.0.function`, `session.tools.2`), for the errors about it."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] | None = None
    strict: bool | None = None
    param: str = "tools"

    @property
    def schema(self) -> Mapping[str, Any]:
        """The schema its arguments validate against."""
        return NO_ARGUMENTS if self.parameters is None else self.parameters

    def prompt_form(self) -> dict[str, Any]:
        """As the chat template shows it to the model (OpenAI's chat-completions tool object, the
        fields the client gave)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = dict(self.parameters)
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class Named:
    """`tool_choice` naming one function."""

    name: str


@dataclass(frozen=True)
class ToolUse:
    """What one answer does with tools (see the module doc)."""

    offered: tuple[Function, ...] = ()  # in the prompt, in the client's order
    structured_output: StructuredOutput | None = None  # the grammar, None: free text
    parse_calls: bool = False  # search the text for calls
    enforced_calls: bool = False  # the grammar makes every call well formed (stream as they come)
    names: frozenset[str] = field(default_factory=frozenset)  # the functions a call may name

    def prompt_tools(self) -> list[dict[str, Any]] | None:
        """The tools for the chat template (None: no tools block)."""
        return [f.prompt_form() for f in self.offered] or None


def check_functions(functions: Sequence[Function]) -> None:
    """Names (OpenAI's pattern, no duplicates) and parameter schemas."""
    seen: set[str] = set()
    for function in functions:
        if not NAME_PATTERN.fullmatch(function.name):
            raise InvalidValue(
                f"function name {function.name!r} must be 1 to 64 letters, digits, underscores or dashes",
                field=f"{function.param}.name",
            )
        if function.name in seen:
            raise InvalidValue(f"function {function.name!r} is given twice", field=f"{function.param}.name")
        seen.add(function.name)
        if function.parameters is not None:
            check_schema(function.parameters, f"{function.param}.parameters")


def check_schema(schema: Any, param: str) -> None:
    """`schema` is a JSON schema (an object, valid against its draft's metaschema)."""
    if not isinstance(schema, Mapping):
        raise InvalidValue("a JSON schema must be an object", field=param)
    if not isinstance(schema.get("$schema", ""), str):  # which draft: read before any checking
        raise InvalidValue("a JSON schema's $schema must be a string", field=param)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise InvalidValue(
            f"not a JSON schema: {exc.message}" + (f" (at {where})" if where else ""), field=param
        ) from None


# What xgrammar (0.2.8 and 0.2.9, the grammar engine of both thinkers) leaves unenforced, shown by
# tests/unit/engine/test_json_grammar.py: a grammar with these would let a constrained answer fail
# its schema. OpenAI's strict structured outputs refuse them too (but multipleOf).
UNENFORCED = {
    "not": "not",
    "if": "if/then/else",
    "then": "if/then/else",
    "else": "if/then/else",
    "dependentRequired": "dependentRequired",
    "dependentSchemas": "dependentSchemas",
    "dependencies": "dependencies",
    "contains": "contains",
    "minContains": "minContains",
    "maxContains": "maxContains",
}


def check_enforceable(schema: Any, param: str) -> None:
    """`schema` (a checked JSON schema) says nothing the thinker's grammar cannot enforce, so every
    answer made under it validates: refused (InvalidValue naming `param` and where in the schema)
    are `not`, `if`/`then`/`else`, `dependentRequired`, `dependentSchemas`, `dependencies`,
    `contains` (`minContains`, `maxContains`), `uniqueItems: true`, `multipleOf` but an unbounded
    integer's by an integer, `allOf` and `oneOf` of more than one schema (`anyOf` is enforced),
    a string's `pattern` or `format` with `minLength`/`maxLength`, `propertyNames` beside
    `properties` or `patternProperties`, and an `enum` or `const` value that fails the rest of its
    schema (the grammar writes the values as given)."""
    validator = jsonschema.validators.validator_for(schema)(schema) if isinstance(schema, Mapping) else None
    for where, sub in _subschemas(schema, ""):
        reason = _unenforced(sub, validator)
        if reason is not None:
            at = f" (at {where.lstrip('/')})" if where else ""
            raise InvalidValue(
                f"the output grammar cannot enforce {reason}{at}; an enforced answer must validate, so "
                "the schema is refused (use anyOf, enum, const, pattern, lengths and bounds)",
                field=param,
            )


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _unenforced(schema: Mapping[str, Any], validator: Any) -> str | None:
    for keyword, name in UNENFORCED.items():
        if keyword in schema:
            return name
    if schema.get("uniqueItems") is True:
        return "uniqueItems"
    if "multipleOf" in schema and not (
        schema.get("type") == "integer"
        and isinstance(schema["multipleOf"], int)
        and not any(bound in schema for bound in _BOUNDS)
    ):
        return "multipleOf (but an unbounded integer's by an integer)"
    for keyword in ("allOf", "oneOf"):
        if isinstance(schema.get(keyword), list) and len(schema[keyword]) > 1:
            return f"{keyword} of more than one schema"
    if ("pattern" in schema or "format" in schema) and ("minLength" in schema or "maxLength" in schema):
        return "a string's pattern or format together with minLength/maxLength"
    if "propertyNames" in schema and ("properties" in schema or "patternProperties" in schema):
        return "propertyNames beside properties or patternProperties"
    values = list(schema.get("enum", [])) if isinstance(schema.get("enum"), list) else []
    if "const" in schema:
        values.append(schema["const"])
    if values and validator is not None:
        own = validator.evolve(schema=dict(schema))
        for value in values:
            if not own.is_valid(value):
                return f"the enum or const value {json.dumps(value)[:40]}, which fails its own schema"
    return None


def _subschemas(schema: Any, where: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every schema object in `schema`, itself first, with its JSON pointer."""
    if not isinstance(schema, Mapping):
        return
    yield where, schema
    for key in SUBSCHEMA_ONE:
        yield from _subschemas(schema.get(key), f"{where}/{key}")
    for key in SUBSCHEMA_LIST:
        if isinstance(schema.get(key), list):
            for i, item in enumerate(schema[key]):
                yield from _subschemas(item, f"{where}/{key}/{i}")
    for key in SUBSCHEMA_MAP:
        if isinstance(schema.get(key), Mapping):
            for name, item in schema[key].items():
                yield from _subschemas(item, f"{where}/{key}/{name}")


def tool_use(
    functions: Sequence[Function],
    choice: Choice | Named = "auto",
    parallel_tool_calls: bool = True,
    response_format: StructuredOutput | None = None,
    choice_param: str = "tool_choice",
) -> ToolUse:
    """The answer's tool use; `response_format` from `response_format_output`."""
    check_functions(functions)
    names = frozenset(f.name for f in functions)
    if isinstance(choice, Named) and choice.name not in names:
        raise InvalidValue(
            f"tool_choice names function {choice.name!r}, which is not among the tools", field=choice_param
        )
    if choice == "required" and not functions:
        raise InvalidValue("tool_choice 'required' needs tools", field=choice_param)
    forced = choice == "required" or isinstance(choice, Named)
    if forced and response_format is not None:
        raise InvalidValue(
            "response_format cannot be combined with tool_choice 'required' or a named function",
            field="response_format",
        )
    if not functions or choice == "none":
        return ToolUse(structured_output=response_format)
    offered = tuple(functions)
    if not forced:  # auto: the calls the model writes, unless its output is JSON
        return ToolUse(offered, response_format, parse_calls=response_format is None, names=names)
    for function in functions:  # the grammar's (a named function's, or every one's)
        if function.parameters is not None and (
            not isinstance(choice, Named) or function.name == choice.name
        ):
            check_enforceable(function.parameters, f"{function.param}.parameters")
    if isinstance(choice, Named):
        (function,) = (f for f in functions if f.name == choice.name)
        grammar: dict[str, Any] = _tag(function)
        callable_names = frozenset({function.name})
    else:
        grammar = {
            "type": "tags_with_separator",
            "tags": [_tag(f) for f in functions],
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": not parallel_tool_calls,
        }
        callable_names = names
    spec = json.dumps({"type": "structural_tag", "format": grammar}, ensure_ascii=False)
    _check_size(spec, "tools")
    structured = StructuredOutput("structural_tag", spec)
    return ToolUse(offered, structured, parse_calls=True, enforced_calls=True, names=callable_names)


def response_format_output(
    kind: str, schema: Mapping[str, Any] | None = None, param: str = "response_format"
) -> StructuredOutput | None:
    """`response_format` as a grammar: `text` None, `json_object`, or `json_schema` (`schema`
    checked; absent: any JSON value)."""
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind != "json_schema":
        raise InvalidValue(
            f"response_format type {kind!r} is not text, json_object or json_schema", field=param
        )
    if schema is not None:
        check_schema(schema, f"{param}.json_schema.schema")
        check_enforceable(schema, f"{param}.json_schema.schema")
    spec = json.dumps({} if schema is None else schema, ensure_ascii=False)
    _check_size(spec, param)
    return StructuredOutput("json_schema", spec)


def _tag(function: Function) -> dict[str, Any]:
    return {
        "type": "tag",
        "begin": call_begin(function.name),
        "content": {
            "type": "json_schema",
            "json_schema": dict(function.schema),
            "max_whitespace_cnt": MAX_WHITESPACE,
        },
        "end": CALL_END,
    }


def _check_size(spec: str, param: str) -> None:
    size = len(spec.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise InvalidValue(
            f"the output grammar is {size} bytes, over the limit of {MAX_SPEC_BYTES}", field=param
        )
