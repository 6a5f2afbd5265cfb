r"""Strict JSON grammars for xgrammar: what both thinker backends give xgrammar for a JSON answer.

A constrained JSON answer (response_format json_object / json_schema, a tool call's arguments) must
be strict JSON, on any checkpoint: no raw control character (U+0000-U+001F) in a string, compact
separators, no whitespace between tokens. xgrammar's own JSON-schema grammars do not hold to that
(found on 0.2.9, .venv's, and 0.2.8, .venv-vllm's; tests/unit/engine/test_json_grammar.py):

* a string with `minLength`/`maxLength` (an array's item, `propertyNames` too) is a repetition of
  `[^"\\\r\n]`: raw control characters (ESC, TAB, NUL, ...) are taken, and no escape is;
* a simple `pattern` becomes rules of the string's decoded text, written as JSON text: one that
  names a control character (`\t`, `\x1b`, `[\x01-\x1f]`) takes it raw, one that names `"` or a
  backslash takes it raw too (ending the string early); a pattern xgrammar keeps as a
  `Regex(..., json_string=true)` takes no raw control character, and no escape either;
* a negated class (any string's characters) takes the surrogate code points, as 3-byte sequences
  that no UTF-8 text holds (a random checkpoint's byte tokens write them);
* 0.2.8 writes `", "` between the items of a free array or object despite compact separators, and
  its `json-pointer` format takes raw quotes and control characters, its `email` invalid escapes;
* a structural tag's `json_schema` content takes `max_whitespace_cnt` blanks (tabs, `\r`,
  newlines) between every two tokens of a call's arguments.

So the grammar is fixed, not the output: `json_schema_ebnf` asks xgrammar for its compact grammar
of the schema (its patterns as placeholders), then rewrites that grammar's text (`strict_ebnf`), and
`strict_structural_tag` gives every JSON content of a structural tag that grammar. The rewrite is
generic, over every rule xgrammar emits: no class or literal takes a raw control character anywhere
(compact JSON has none, in a string or between tokens) nor a surrogate; a class that takes a raw
`"` or backslash inside a string takes its escape instead; a length-bounded string's characters take
JSON's escapes; a pattern is matched by the string's decoded text (the pattern's own rules, each
character JSON must escape written escaped); a separator has no blank around it. What it removes
is never in the compact JSON of a valid instance (`json.dumps(v, separators=(",", ":"),
ensure_ascii=False)`), so a schema's valid answers all stay: the tests check both, over generated
schemas, on both versions.

xgrammar only, no torch: the vLLM thinker builds the same grammars in its own environment.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import xgrammar as xgr

from omnistream.request.structured import SUBSCHEMA_LIST, SUBSCHEMA_MAP, SUBSCHEMA_ONE

# JSON's separators with no whitespace around them (vLLM's disable_any_whitespace).
COMPACT = (",", ":")
# The rule this module adds: one JSON escape after a backslash, never a lone surrogate (`\ud83d`
# would count as one character of a length-bounded string while it is half of one).
ESCAPE_RULE = "strict_json_escape"
_HEX = "[0-9A-Fa-f]"
_ESCAPE_BODY = (
    f'(([\\"\\\\/bfnrt]) | ("u" [0-9A-Ca-c] {_HEX} {_HEX} {_HEX}) | ("u" [Dd] [0-7] {_HEX} {_HEX}) '
    f'| ("u" [E-Fe-f] {_HEX} {_HEX} {_HEX}))'
)
# What JSON text may not hold raw inside a string: the control characters, the quote, the backslash.
_MUST_ESCAPE = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
# The characters a backslash may take as a one-character escape; with `u`, the letters of an escape.
_ESCAPE_CHARS = [(ord(c), ord(c)) for c in sorted('"\\/bfnrt')]
_ESCAPE_LETTERS = [*_ESCAPE_CHARS, (ord("u"), ord("u"))]
_QUOTE_BACKSLASH = [(0x22, 0x22), (0x5C, 0x5C)]
# Surrogate code points: xgrammar's negated classes take them (as 3-byte sequences no UTF-8 text has).
_SURROGATES = [(0xD800, 0xDFFF)]
_MAX_CHAR = 0x10FFFF
_STRUCTURAL = set(",:[]{}")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RULE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) ::= (.*)$")

Ranges = list[tuple[int, int]]


def json_schema_ebnf(schema: str | bool | Mapping[str, Any], any_order: bool = False) -> str:
    """The strict grammar (xgrammar EBNF, root rule `root`) of one JSON value valid against
    `schema` (JSON text or a parsed schema). Raises what xgrammar raises for a schema it refuses,
    and ValueError for a grammar this module cannot make strict.

    The schema's patterns are given to xgrammar as placeholders (xgrammar writes some patterns as
    rules of their decoded text, which cannot be told from the rules of JSON text), and each
    placeholder's rule is then the pattern's own grammar, over the string's decoded text."""
    parsed = json.loads(schema) if isinstance(schema, str) else schema
    patterns: list[str] = []
    masked = _mask_patterns(parsed, patterns)
    grammar = xgr.Grammar.from_json_schema(
        json.dumps(masked, ensure_ascii=False),
        any_whitespace=False,
        separators=COMPACT,
        strict_mode=True,
        any_order=any_order,
    )
    return strict_ebnf(str(grammar), patterns)


def _placeholder(index: int) -> str:
    """The pattern xgrammar is given for the schema's pattern `index` (one it writes as a `Regex`)."""
    return f"^(OmnistreamPattern{index}Q)+$"


def _mask_patterns(schema: Any, patterns: list[str]) -> Any:
    """A copy of `schema` whose patterns (`pattern`, `patternProperties`' keys) are placeholders;
    the patterns are appended to `patterns`, placeholder i standing for patterns[i]."""
    if not isinstance(schema, dict):
        return schema

    def mask(pattern: str) -> str:
        patterns.append(pattern)
        return _placeholder(len(patterns) - 1)

    out = dict(schema)
    if isinstance(out.get("pattern"), str):
        out["pattern"] = mask(out["pattern"])
    for key in SUBSCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = _mask_patterns(out[key], patterns)
    for key in SUBSCHEMA_LIST:
        if isinstance(out.get(key), list):
            out[key] = [_mask_patterns(item, patterns) for item in out[key]]
    for key in SUBSCHEMA_MAP:
        if isinstance(out.get(key), dict):
            out[key] = {
                (mask(name) if key == "patternProperties" else name): _mask_patterns(value, patterns)
                for name, value in out[key].items()
            }
    return out


@functools.lru_cache(maxsize=256)
def strict_grammar(kind: str, spec: str) -> str:
    """A structured output's (`StructuredOutput`'s kind and spec) strict grammar: EBNF for
    `json_schema` and `json_object`, the structural tag's JSON text for `structural_tag`. Kept
    (the vLLM thinker builds it for every request, and a conversation sends its grammar each turn).
    Raises ValueError (or xgrammar's error) for a spec that has no grammar."""
    if kind == "json_object":
        return json_object_ebnf()
    if kind == "json_schema":
        schema = json.loads(spec)
        if not isinstance(schema, dict | bool):
            raise ValueError("a JSON schema is an object or a boolean")
        return json_schema_ebnf(schema)
    if kind == "structural_tag":
        return strict_structural_tag(spec)
    raise ValueError(f"unknown structured output kind {kind!r}")


def json_object_ebnf() -> str:
    """The strict grammar of any JSON object (response_format json_object)."""
    return json_schema_ebnf('{"type": "object"}')


def strict_structural_tag(spec: str) -> str:
    """A structural tag (JSON text, either of xgrammar's forms) with every JSON content made strict:
    each `json_schema` content (style `json`) of its format tree, however deep (tag, sequence, or,
    tags_with_separator, triggered_tags, ...), becomes a `grammar` content of `json_schema_ebnf`.
    The older form (`structures` and `triggers`) becomes the `triggered_tags` it means. Returns
    the tag's JSON text; raises ValueError for a spec that is not a structural tag."""
    tag = json.loads(spec)
    if not isinstance(tag, dict):
        raise ValueError("a structural tag is a JSON object")
    if "structures" in tag:
        tag = {
            "type": "structural_tag",
            "format": {
                "type": "triggered_tags",
                "triggers": tag["triggers"],
                "tags": [
                    {
                        "type": "tag",
                        "begin": s["begin"],
                        "content": {"type": "json_schema", "json_schema": s["schema"]},
                        "end": s["end"],
                    }
                    for s in tag["structures"]
                ],
            },
        }
    return json.dumps(_strict_format(tag), ensure_ascii=False)


def _strict_format(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict_format(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "json_schema" and node.get("style", "json") == "json":
        if node.get("excludes"):
            raise ValueError("a json_schema content with excludes cannot be made strict JSON")
        return {
            "type": "grammar",
            "grammar": json_schema_ebnf(node["json_schema"], any_order=bool(node.get("any_order", False))),
        }
    if node.get("type") in ("json_schema", "qwen_xml_parameter", "grammar", "regex"):
        return node  # not JSON (an XML style), or text this module does not read
    return {key: _strict_format(value) for key, value in node.items()}


# --- the rewrite of xgrammar's EBNF ----------------------------------------------------------------
def strict_ebnf(ebnf: str, patterns: Sequence[str] = ()) -> str:
    """xgrammar's printed grammar of a JSON value (`str(Grammar)`: one `name ::= body` a line),
    rewritten to produce strict, compact JSON only (see the module doc). `patterns`: what the
    grammar's placeholder patterns stand for (`_mask_patterns`)."""
    rules: list[tuple[str, str]] = []
    for line in ebnf.splitlines():
        if not line.strip():
            continue
        match = _RULE.match(line)
        if match is None:
            raise ValueError(f"unexpected grammar line: {line[:80]!r}")
        rules.append((match.group(1), match.group(2)))
    names = {name for name, _ in rules}
    if ESCAPE_RULE in names:
        raise ValueError(f"the grammar already has a rule {ESCAPE_RULE}")
    out: list[str] = []
    extra: list[str] = []
    rewriter = _Rewriter(names, extra, patterns)
    for name, body in rules:
        out.append(f"{name} ::= {rewriter.body(name, body, decoded=False)}")
    out.extend(extra)
    out.append(f"{ESCAPE_RULE} ::= {_ESCAPE_BODY}")
    return "\n".join(out) + "\n"


class _Rewriter:
    """Rewrites rule bodies. JSON text mode (`decoded=False`): the rule's characters are JSON text
    as written. Decoded mode (a pattern's rules): its characters are a string's decoded text, each
    written as JSON writes it in a string (escaped where JSON must escape it)."""

    def __init__(self, names: set[str], extra: list[str], patterns: Sequence[str]) -> None:
        self.names = names
        self.placeholders = {_placeholder(i): pattern for i, pattern in enumerate(patterns)}
        self.extra = extra  # the rules made for patterns
        self.patterns = 0

    def body(self, rule: str, body: str, decoded: bool) -> str:
        out: list[str] = []
        escaping = False  # JSON text mode: the text so far ends inside an escape (after a backslash)
        i = 0
        while i < len(body):
            c = body[i]
            if c == " ":  # between a sequence's elements
                out.append(c)
                i += 1
                continue
            if c == '"':
                end, text = _read_literal(body, i)
                if decoded:
                    out.append(_literal(_json_encoded(text)))
                else:
                    text, escaping = _strict_text_literal(text, escaping)
                    out.append(_literal(text))
                i = end
                continue
            if c == "[":
                end, negated, ranges = _read_class(body, i)
                out.append(self._class(body[i:end], negated, ranges, decoded, escaping))
                escaping = False
                i = end
                continue
            escaping = False
            if body.startswith("(=", i):  # a lookahead: it only ever narrows, kept as written
                end = _group_end(body, i)
                out.append(body[i:end])
                i = end
                continue
            ident = _IDENT.match(body, i)
            if ident is not None:
                end = ident.end()
                if end < len(body) and body[end] == "(":
                    if ident.group() != "Regex":
                        raise ValueError(f"unexpected grammar construct {ident.group()}(...)")
                    close = _group_end(body, end)
                    out.append(self._pattern(rule, body[end + 1 : close - 1], decoded))
                    i = close
                    continue
                out.append(ident.group())
                i = end
                continue
            out.append(c)
            i += 1
        return "".join(out)

    def _class(self, written: str, negated: bool, ranges: Ranges, decoded: bool, escaping: bool) -> str:
        written_set = _complement(ranges) if negated else ranges
        allowed = _subtract(written_set, _SURROGATES)  # no UTF-8 text holds one
        if not decoded and (
            escaping or (_subtract(allowed, _ESCAPE_LETTERS) == [] and _intersect(allowed, _QUOTE_BACKSLASH))
        ):
            # The character after a backslash (a class of escape letters, as xgrammar's
            # `basic_escape` starts): one of JSON's one-character escapes.
            kept = _intersect(allowed, _ESCAPE_CHARS)
            if not kept:
                raise ValueError("an escape of the grammar admits no JSON escape")
            return written if kept == written_set else _class_text(kept)
        bad = _intersect(allowed, _MUST_ESCAPE)
        if not bad:
            return written if allowed == written_set else _class_text(allowed)
        raw = _subtract(allowed, _MUST_ESCAPE)
        alternatives = [_class_text(raw)] if raw else []
        if decoded or _intersect(bad, _QUOTE_BACKSLASH):
            # A string's decoded characters (a pattern's; a format's that xgrammar writes as such):
            # the ones JSON must escape, escaped.
            alternatives += [_literal(_json_encoded(chr(c))) for c in _members(bad)]
        elif negated and _contains(ranges, 0x22) and _contains(ranges, 0x5C):
            # A string's characters as xgrammar writes them for a length-bounded string (without
            # the quote and the backslash, and so without any escape): any character, raw where
            # JSON allows it raw, else escaped.
            alternatives.append(f'("\\\\" {ESCAPE_RULE})')
        # Else control characters in JSON text (blanks between tokens, or raw in a string): left out.
        if not alternatives:
            raise ValueError("a character class of the grammar admits no character of strict JSON")
        if len(alternatives) == 1:
            return alternatives[0]
        return "(" + " | ".join(f"({a})" for a in alternatives) + ")"

    def _pattern(self, rule: str, arguments: str, decoded: bool) -> str:
        """`Regex("pattern", json_string=true)`: the pattern's own rules (xgrammar's `from_regex`),
        in decoded mode, under names of their own; returns the reference to their root."""
        end, pattern = _read_literal(arguments, arguments.index('"'))
        flags = arguments[end:].replace(" ", "")
        in_string = decoded or flags == ",json_string=true"
        if flags not in ("", ",json_string=true", ",json_string=false"):
            raise ValueError(f"unexpected Regex arguments: {arguments[:80]!r}")
        if pattern in self.placeholders:
            pattern, in_string = self.placeholders[pattern], True
        self.patterns += 1
        prefix = f"{rule}_pattern{self.patterns}_"
        expanded = str(xgr.Grammar.from_regex(pattern))
        inner: list[tuple[str, str]] = []
        for line in expanded.splitlines():
            if line.strip():
                match = _RULE.match(line)
                if match is None:
                    raise ValueError(f"unexpected grammar line: {line[:80]!r}")
                inner.append((match.group(1), match.group(2)))
        local = {name for name, _ in inner}
        for name in local:
            if prefix + name in self.names:
                raise ValueError(f"a pattern's rule {prefix + name} clashes with the grammar's")
            self.names.add(prefix + name)

        def rename(match: re.Match[str]) -> str:
            return prefix + match.group() if match.group() in local else match.group()

        for name, body in inner:
            rewritten = self.body(prefix + name, body, decoded=in_string)
            self.extra.append(f"{prefix}{name} ::= {_rename_idents(rewritten, rename)}")
        return prefix + "root"


def _strict_text_literal(text: str, escaping: bool) -> tuple[str, bool]:
    """A literal of JSON text: no control character (a blank between tokens, or one a string may
    not hold raw), no blanks around a separator. Returns it and whether it ends inside an escape."""
    text = "".join(c for c in text if ord(c) >= 0x20)
    stripped = text.strip(" ")
    if stripped in _STRUCTURAL and stripped != text:
        text = stripped
    for c in text:
        escaping = not escaping and c == "\\"
    return text, escaping


def _json_encoded(text: str) -> str:
    """`text` as it is written inside a JSON string (json.dumps's escapes, nothing else escaped)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _rename_idents(body: str, rename: Callable[[re.Match[str]], str]) -> str:
    """`rename` applied to the rule names of `body` (not to the text of its literals and classes)."""
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == '"':
            end, _ = _read_literal(body, i)
        elif c == "[":
            end, _, _ = _read_class(body, i)
        else:
            ident = _IDENT.match(body, i)
            if ident is not None:
                out.append(rename(ident))
                i = ident.end()
                continue
            end = i + 1
        out.append(body[i:end])
        i = end
    return "".join(out)


# --- reading and writing EBNF's literals and classes -----------------------------------------------
_SIMPLE_ESCAPES = {
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "0": "\0",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
    "e": "\x1b",
}


def _read_escape(text: str, i: int) -> tuple[int, str]:
    """The escape at text[i] (a backslash): (the index after it, the character it stands for)."""
    c = text[i + 1]
    if c in "xuU":
        width = {"x": 2, "u": 4, "U": 8}[c]
        return i + 2 + width, chr(int(text[i + 2 : i + 2 + width], 16))
    if c in _SIMPLE_ESCAPES:
        return i + 2, _SIMPLE_ESCAPES[c]
    return i + 2, c


def _read_literal(text: str, i: int) -> tuple[int, str]:
    """The string literal starting at text[i] (a quote): (the index after it, its characters)."""
    chars: list[str] = []
    j = i + 1
    while text[j] != '"':
        if text[j] == "\\":
            j, c = _read_escape(text, j)
        else:
            c = text[j]
            j += 1
        chars.append(c)
    return j + 1, "".join(chars)


def _read_class(text: str, i: int) -> tuple[int, bool, Ranges]:
    """The character class starting at text[i] ('['): (the index after it, negated, its ranges)."""
    j = i + 1
    negated = text[j] == "^"
    if negated:
        j += 1
    ranges: Ranges = []
    while text[j] != "]":
        j, low = _class_char(text, j)
        if text[j] == "-" and text[j + 1] != "]":
            j, high = _class_char(text, j + 1)
        else:
            high = low
        ranges.append((ord(low), ord(high)))
    return j + 1, negated, _normal(ranges)


def _class_char(text: str, j: int) -> tuple[int, str]:
    if text[j] == "\\":
        return _read_escape(text, j)
    return j + 1, text[j]


def _group_end(text: str, i: int) -> int:
    """The index after the group opened at text[i] ('('), literals and classes skipped."""
    depth = 0
    j = i
    while True:
        c = text[j]
        if c == '"':
            j, _ = _read_literal(text, j)
            continue
        if c == "[":
            j, _, _ = _read_class(text, j)
            continue
        depth += {"(": 1, ")": -1}.get(c, 0)
        j += 1
        if depth == 0:
            return j


def _char_text(code: int, in_class: bool) -> str:
    c = chr(code)
    if 0x20 <= code < 0x7F and c not in '\\"' and not (in_class and c in "[]^-"):
        return c
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _literal(text: str) -> str:
    return '"' + "".join(_char_text(ord(c), False) for c in text) + '"'


def _ranges_text(ranges: Ranges) -> str:
    return "".join(
        _char_text(low, True) + ("" if low == high else "-" + _char_text(high, True)) for low, high in ranges
    )


def _class_text(ranges: Ranges) -> str:
    """A class admitting `ranges` (the shorter of the positive and the negated form)."""
    outside = _complement(ranges)
    if len(outside) < len(ranges):
        return "[^" + _ranges_text(outside) + "]"
    return "[" + _ranges_text(ranges) + "]"


# --- sets of characters as sorted, disjoint, inclusive ranges ---------------------------------------
def _normal(ranges: Ranges) -> Ranges:
    merged: Ranges = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def _complement(ranges: Ranges) -> Ranges:
    out: Ranges = []
    start = 0
    for low, high in _normal(ranges):
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= _MAX_CHAR:
        out.append((start, _MAX_CHAR))
    return out


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    return _normal([(max(x, y), min(p, q)) for x, p in a for y, q in b if max(x, y) <= min(p, q)])


def _subtract(a: Ranges, b: Ranges) -> Ranges:
    return _intersect(a, _complement(b))


def _contains(ranges: Ranges, code: int) -> bool:
    return any(low <= code <= high for low, high in ranges)


def _members(ranges: Ranges) -> list[int]:
    return [c for low, high in ranges for c in range(low, high + 1)]
