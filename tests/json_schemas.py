"""Generated JSON schemas for the grammar property tests, and what those tests check an answer for.

`schemas()` is a hypothesis strategy of the schemas a client sends (objects, arrays with item
bounds, enums and consts with awkward strings, nested objects, strings with lengths, patterns and
formats, integers with bounds, numbers, booleans, null, anyOf), using only what the output grammar
enforces (gateway/tools/spec.py refuses the rest), so every answer made under one must validate.
`instances(schema)` draws valid instances of one (hypothesis-jsonschema's `from_schema` would, but
its latest release, 0.23.1, draws objects with a hypothesis internal that hypothesis 6.170 no
longer has: `cu.many(...).more()`; the subset here is small enough to draw directly).

`max_json_bytes` bounds the compact serialisation of any answer a bounded schema allows (None when
the schema has no bound), `strictness_problems` finds what strict compact JSON may not hold (raw
control characters, whitespace between tokens), `in_schema_order` writes an instance with its
properties in the schema's order (the grammar's), `byte_walks` draws texts from a grammar itself.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from typing import Any

try:  # the strategies need hypothesis; the checks run in the vLLM environment too, which has none
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    st = None  # type: ignore[assignment]

# Property names and enum strings a grammar must write right: quotes, backslashes, control
# characters (escaped in JSON), non-ASCII, a line separator, spaces.
NAMES = ["a", "id", "city", "x y", 'q"t', "tab\t", "é", "back\\slash", "日本", "\x1b"]
STRINGS = ["", "a", "Paris", 'say "hi"', "tab\there", "line\nbreak", "esc\x1b", "é", "\u2028", "\\", "😀"]
# Pattern pieces whose Python and xgrammar readings agree (no \d, \w, \s: Python's are Unicode's).
ATOMS = ["[a-z]", "[A-Z0-9]", "x", "é", ".", "[^a-z]", "\\t", '"', "\\\\", "[\\x01-\\x1f]", "(ab|c)", "-"]
QUANTIFIERS = ["", "?", "*", "+", "{1,3}", "{2}"]
FORMATS = ["date", "uuid", "ipv4"]


def _pattern() -> st.SearchStrategy[str]:
    piece = st.tuples(st.sampled_from(ATOMS), st.sampled_from(QUANTIFIERS)).map("".join)
    return st.lists(piece, min_size=1, max_size=3).map(lambda pieces: "^" + "".join(pieces) + "$")


def _bounded_string() -> st.SearchStrategy[dict[str, Any]]:
    def make(high: int, low: int, with_low: bool) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string", "maxLength": high}
        if with_low:
            schema["minLength"] = min(low, high)
        return schema

    return st.builds(make, st.integers(0, 6), st.integers(0, 3), st.booleans())


def _string() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        _bounded_string(),
        st.just({"type": "string"}),
        st.builds(lambda n: {"type": "string", "minLength": n}, st.integers(0, 3)),
        st.builds(lambda p: {"type": "string", "pattern": p}, _pattern()),
        st.builds(lambda f: {"type": "string", "format": f}, st.sampled_from(FORMATS)),
    )


def _integer(bounded: bool) -> st.SearchStrategy[dict[str, Any]]:
    def make(low: int, span: int, step: int | None, which: str) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "integer"}
        if bounded or which in ("both", "low"):
            schema["minimum"] = low
        if bounded or which in ("both", "high"):
            schema["maximum"] = low + span
        if step is not None and len(schema) == 1:  # xgrammar ignores multipleOf beside a bound
            schema["multipleOf"] = step
        return schema

    return st.builds(
        make,
        st.integers(-1000, 1000),
        st.integers(0, 5000),
        st.one_of(st.none(), st.integers(1, 7)),
        st.sampled_from(["both", "low", "high", "none"]),
    )


def _number() -> st.SearchStrategy[dict[str, Any]]:
    def make(low: float | None, high: float | None) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "number"}
        if low is not None:
            schema["minimum"] = low
        if low is not None and high is not None:
            schema["maximum"] = low + abs(high)
        return schema

    bound = st.one_of(st.none(), st.integers(-100, 100), st.sampled_from([0.5, -2.25, 10.125]))
    return st.builds(make, bound, bound)


def _scalars() -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(STRINGS), st.integers(-50, 50), st.booleans(), st.none())


def _leaf(bounded: bool) -> st.SearchStrategy[dict[str, Any]]:
    leaves = [
        _bounded_string() if bounded else _string(),
        _integer(bounded),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.lists(_scalars(), min_size=1, max_size=4, unique_by=json.dumps).map(lambda v: {"enum": v}),
        st.lists(st.sampled_from(STRINGS), min_size=1, max_size=4, unique=True).map(
            lambda v: {"type": "string", "enum": v}
        ),
        _scalars().map(lambda v: {"const": v}),
    ]
    if not bounded:
        leaves.append(_number())
    return st.one_of(*leaves)


def _composite(
    children: st.SearchStrategy[dict[str, Any]], bounded: bool
) -> st.SearchStrategy[dict[str, Any]]:
    def array(items: dict[str, Any], high: int, low: int, with_high: bool) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "array", "items": items, "minItems": min(low, high)}
        if bounded or with_high:
            schema["maxItems"] = high
        return schema

    def obj(
        props: dict[str, dict[str, Any]], required: list[bool], extra: dict[str, Any] | None
    ) -> dict[str, Any]:
        names = list(props)
        return {
            "type": "object",
            "properties": props,
            "required": [n for n, r in zip(names, required, strict=False) if r],
            "additionalProperties": False if bounded or extra is None else extra,
        }

    return st.one_of(
        st.builds(array, children, st.integers(0, 3), st.integers(0, 2), st.booleans()),
        st.builds(
            obj,
            st.dictionaries(st.sampled_from(NAMES), children, min_size=1, max_size=3),
            st.lists(st.booleans(), min_size=3, max_size=3),
            st.one_of(st.none(), _bounded_string()),
        ),
        st.lists(children, min_size=2, max_size=2).map(lambda branches: {"anyOf": branches}),
    )


def schemas(bounded: bool = False, max_leaves: int = 5) -> st.SearchStrategy[dict[str, Any]]:
    """Schemas of the grammar's keywords. `bounded`: every string has a maxLength, every array
    maxItems, every integer both bounds, no number and no extra properties (`max_json_bytes` is
    then never None)."""
    return st.recursive(_leaf(bounded), lambda c: _composite(c, bounded), max_leaves=max_leaves)


def as_parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` as a function's parameters (an object): its one required argument `value`."""
    if schema.get("type") == "object":
        return schema
    return {
        "type": "object",
        "properties": {"value": schema},
        "required": ["value"],
        "additionalProperties": False,
    }


# --- valid instances ---------------------------------------------------------------------------------
_FORMAT_VALUES = {
    "date": lambda: st.dates().map(lambda d: d.isoformat()),
    "uuid": lambda: st.uuids().map(str),
    "ipv4": lambda: st.ip_addresses(v=4).map(str),
}


def instances(schema: Any) -> st.SearchStrategy[Any]:
    """Values valid against `schema` (one of `schemas()`), any of them."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    if "anyOf" in schema:
        return st.one_of(*(instances(branch) for branch in schema["anyOf"]))
    kind = schema.get("type")
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"][1:-1], fullmatch=True)
        if "format" in schema:
            return _FORMAT_VALUES[schema["format"]]()
        return st.text(min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 8))
    if kind == "integer":
        values = st.integers(schema.get("minimum"), schema.get("maximum"))
        step = schema.get("multipleOf")
        return values if step is None else values.filter(lambda v: v % step == 0)
    if kind == "number":
        # Decimals of a few places: xgrammar's grammar of a bounded number has no exponent and at
        # most six decimals (a narrowing, never a wrong answer).
        low, high = schema.get("minimum", -(10**6)), schema.get("maximum", 10**6)
        return st.decimals(low, high, places=3, allow_nan=False, allow_infinity=False).map(float)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(
            instances(schema["items"]),
            min_size=schema.get("minItems", 0),
            max_size=min(schema.get("maxItems", 4), 4),
        )
    if kind == "object":
        return _objects(schema)
    raise AssertionError(f"not a schema of `schemas()`: {schema}")


@st.composite if st is not None else (lambda f: f)  # type: ignore[misc]
def _objects(draw: Any, schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties", {})
    out = {}
    for name, sub in props.items():
        if name in schema.get("required", []) or draw(st.booleans()):
            out[name] = draw(instances(sub))
    extra = schema.get("additionalProperties", False)
    if extra is not False:
        names = st.text(max_size=4).filter(lambda n: n not in props)
        out.update(draw(st.dictionaries(names, instances(extra), max_size=2)))
    return out


# --- bounds ------------------------------------------------------------------------------------------
# The longest a string's character can be in the grammar's JSON: an escape (\u001b), 6 bytes.
CHAR_BYTES = 6


def max_json_bytes(schema: Any) -> int | None:
    """The most UTF-8 bytes of the compact JSON of any value the strict grammar allows for
    `schema`, or None when unbounded (a string without maxLength, a pattern or format, an array
    without maxItems, a number, an integer without both bounds, extra properties)."""
    if schema is True or schema == {}:
        return None
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        # ensure_ascii writes each character at least as long as the grammar does
        return max(len(json.dumps(v, separators=(",", ":"), ensure_ascii=True)) for v in values)
    if "anyOf" in schema:
        bounds = [max_json_bytes(s) for s in schema["anyOf"]]
        return None if None in bounds else max(b for b in bounds if b is not None)
    kind = schema.get("type")
    if kind == "string":
        if "pattern" in schema or "format" in schema or "maxLength" not in schema:
            return None
        return 2 + CHAR_BYTES * int(schema["maxLength"])
    if kind == "integer":
        if "minimum" not in schema or "maximum" not in schema:
            return None
        return max(len(str(schema["minimum"])), len(str(schema["maximum"])))
    if kind == "boolean":
        return 5
    if kind == "null":
        return 4
    if kind == "array":
        item = max_json_bytes(schema.get("items", {}))
        if "maxItems" not in schema or item is None:
            return None
        n = int(schema["maxItems"])
        return 2 + n * item + max(0, n - 1)
    if kind == "object":
        # xgrammar's strict mode takes no extra property beside `properties` (an object without
        # them takes any)
        if schema.get("additionalProperties", "properties" not in schema) is not False:
            return None
        total = 2
        for name, sub in schema.get("properties", {}).items():
            value = max_json_bytes(sub)
            if value is None:
                return None
            total += len(json.dumps(name, ensure_ascii=True)) + 1 + value + 1
        return total
    return None


# --- what strict compact JSON may not hold -----------------------------------------------------------
WHITESPACE = " \t\n\r"


def _scanned(text: str) -> Iterator[tuple[int, str, str]]:
    """(index, character, where it stands) of JSON text: `outside` a string, in a `string`, or the
    `escape` after a backslash in one (strings' quotes and backslashes move the state)."""
    where = "outside"
    for i, c in enumerate(text):
        yield i, c, where
        if where == "escape":
            where = "string"
        elif where == "string":
            where = {"\\": "escape", '"': "outside"}.get(c, "string")
        elif c == '"':
            where = "string"


def strictness_problems(text: str) -> list[str]:
    """What `text` (a whole JSON value, or the beginning of one) holds that strict compact JSON does
    not: a raw control character (in a string or not), whitespace between tokens, an escape JSON
    does not have. Empty when none."""
    problems = []
    for i, c, where in _scanned(text):
        if ord(c) < 0x20 and (where != "outside" or c not in WHITESPACE):
            problems.append(f"raw control character {c!r} at {i}")
        elif where == "escape" and c not in '"\\/bfnrtu':
            problems.append(f"escape \\{c} at {i}")
        elif where == "outside" and c in WHITESPACE:
            problems.append(f"whitespace {c!r} between tokens at {i}")
    return problems


def answer_problems(answer: bytes | str, ended: bool, schema: Any) -> list[str]:
    """What is wrong with one constrained answer (bytes a grammar made, or an answer's text): not
    UTF-8, not strict compact JSON (`strictness_problems`, for a cut one too); once ended, not JSON
    (strict `json.loads`) or not valid against `schema` (jsonschema)."""
    import jsonschema

    if isinstance(answer, bytes):
        try:
            text = answer.decode("utf-8")
        except UnicodeDecodeError:
            if ended:
                return [f"not UTF-8: {answer!r}"]
            text = answer.decode("utf-8", "replace")  # cut inside a character
    else:
        text = answer
    problems = strictness_problems(text)
    if ended and not problems:
        try:
            value = json.loads(text)
        except ValueError as exc:
            return [f"not JSON ({exc}): {text!r}"]
        validator = jsonschema.validators.validator_for(schema)(schema)
        problems += [f"invalid ({e.message}): {text!r}" for e in validator.iter_errors(value)]
    return problems


def separators_at(text: str) -> list[int]:
    """The indexes of the `,` and `:` of `text` (JSON) that are outside its strings."""
    return [i for i, c, where in _scanned(text) if where == "outside" and c in ",:"]


# --- what xgrammar does not enforce --------------------------------------------------------------------
# (keyword, schema, an instance that fails the schema and that xgrammar's grammar of it takes),
# on xgrammar 0.2.8 and 0.2.9: what gateway/tools/spec.py `check_enforceable` refuses.
_TWO = {"a": {"type": "integer"}, "b": {"type": "integer"}}
UNENFORCED_CASES: list[tuple[str, dict[str, Any], Any]] = [
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 1]),
    ("multipleOf of a number", {"type": "number", "multipleOf": 0.5}, 0.3),
    ("multipleOf by a fraction", {"type": "integer", "multipleOf": 1.5}, 4),
    ("multipleOf beside a bound", {"type": "integer", "multipleOf": 4, "minimum": 0}, 5),
    ("multipleOf without a type", {"multipleOf": 3}, 4),
    ("not", {"type": "integer", "not": {"const": 3}}, 3),
    (
        "if/then/else",
        {"type": "object", "properties": _TWO, "if": {"required": ["a"]}, "then": {"required": ["b"]}},
        {"a": 1},
    ),
    (
        "dependentRequired",
        {"type": "object", "properties": _TWO, "dependentRequired": {"a": ["b"]}},
        {"a": 1},
    ),
    (
        "dependentSchemas",
        {"type": "object", "properties": _TWO, "dependentSchemas": {"a": {"required": ["b"]}}},
        {"a": 1},
    ),
    (
        "dependencies",
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": _TWO,
            "dependencies": {"a": ["b"]},
        },
        {"a": 1},
    ),
    ("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, [1]),
    (
        "maxContains",
        {"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}, "maxContains": 1},
        [5, 5],
    ),
    ("allOf", {"allOf": [{"type": "string"}, {"enum": ["yes", "no"]}]}, "maybe"),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1),
    ("pattern with maxLength", {"type": "string", "pattern": "^[a-z]+$", "maxLength": 2}, "abc"),
    ("pattern with minLength", {"type": "string", "pattern": "^[a-z]+$", "minLength": 3}, "a"),
    ("format with maxLength", {"type": "string", "format": "date", "maxLength": 3}, "2024-01-01"),
    (
        "propertyNames beside properties",
        {"type": "object", "properties": {"abc": {"type": "integer"}}, "propertyNames": {"maxLength": 2}},
        {"abc": 1},
    ),
    ("enum beside type", {"type": "string", "enum": ["a", 1]}, 1),
    ("const beside type", {"type": "integer", "const": "a"}, "a"),
    ("enum beside minLength", {"enum": ["a", "bb"], "minLength": 2}, "a"),
]


# --- instances as the grammar writes them ------------------------------------------------------------
class NotInGrammar(Exception):
    """An instance the schema takes that the grammar need not (a pattern matched by search, not
    whole: Python's `$` takes a final newline)."""


def in_schema_order(instance: Any, schema: Any, validator: Any) -> Any:
    """`instance` with every object's properties in its schema's order, declared ones first (the
    grammar's order). `validator`: the root schema's (anyOf branches are chosen with it)."""
    if not isinstance(schema, dict):
        return instance
    if "anyOf" in schema:
        for branch in schema["anyOf"]:
            if validator.evolve(schema=branch).is_valid(instance):
                return in_schema_order(instance, branch, validator)
        return instance
    if (
        isinstance(instance, str)
        and "pattern" in schema
        and not re.fullmatch(schema["pattern"][1:-1], instance)
    ):
        raise NotInGrammar(schema["pattern"])
    if isinstance(instance, list):
        return [in_schema_order(v, schema.get("items", {}), validator) for v in instance]
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", {})
        ordered = {k: in_schema_order(instance[k], props[k], validator) for k in props if k in instance}
        ordered.update(
            {k: in_schema_order(v, extra, validator) for k, v in instance.items() if k not in props}
        )
        return ordered
    return instance


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# --- tool calls ----------------------------------------------------------------------------------------
def calls_of(text: str) -> list[tuple[str, str]]:
    """(name, arguments) of each call a forced-call grammar made (gateway/tools/spec.py's tags, one
    after another, the separator between them)."""
    from gateway.tools.spec import CALL_END, CALL_END_TAG, call_begin

    calls = []
    for piece in text.split(CALL_END_TAG)[:-1]:
        piece = piece.removeprefix("\n")
        name = piece.split('"name": "', 1)[1].split('"', 1)[0]
        begin, end = call_begin(name), CALL_END.removesuffix(CALL_END_TAG)
        assert piece.startswith(begin) and piece.endswith(end), piece
        calls.append((name, piece[len(begin) : -len(end)]))
    return calls


# --- texts drawn from a grammar ----------------------------------------------------------------------
def byte_tokenizer() -> Any:
    """xgrammar's view of a vocabulary of the 256 bytes and an end token (id 256)."""
    import xgrammar as xgr

    vocab: list[bytes] = [bytes([i]) for i in range(256)] + [b"<end>"]
    return xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, stop_token_ids=[256])


def byte_walks(compiled: Any, seed: int, walks: int, limit: int = 300) -> list[tuple[bytes, bool]]:
    """`walks` texts the compiled grammar (over `byte_tokenizer`) allows, each byte drawn at random
    among those it allows next (the end, and closing a string or a structure, drawn more often so
    that most walks end): (the bytes, whether the grammar ended) for each."""
    import torch
    import xgrammar as xgr

    rng = random.Random(seed)
    out = []
    bitmask = xgr.allocate_token_bitmask(1, 257)
    closers = {ord(c) for c in '"}]'}
    for _ in range(walks):
        matcher = xgr.GrammarMatcher(compiled)
        text = bytearray()
        ended = False
        for _ in range(limit):
            matcher.fill_next_token_bitmask(bitmask)
            bits = (bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
            allowed = bits.flatten()[:257].nonzero().flatten().tolist()
            if not allowed:
                break
            if 256 in allowed and rng.random() < 0.5:
                token = 256
            elif closers.intersection(allowed) and rng.random() < 0.3:
                token = rng.choice(sorted(closers.intersection(allowed)))
            else:
                token = rng.choice(allowed)
            assert matcher.accept_token(token)
            if token == 256:
                ended = True
                break
            text.append(token)
        out.append((bytes(text), ended))
    return out
