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
of the schema (its patterns as placeholders), then rewrites that grammar's text (`strict_ebnf`, in
ebnf_rewrite.py: generic, over every rule xgrammar emits; the EBNF text it reads and writes:
ebnf_text.py), and `strict_structural_tag` gives every JSON content of a structural tag that
grammar (this module walks the schemas and structural tags). What the rewrite removes is never in
the compact JSON of a valid instance (`json.dumps(v, separators=(",", ":"), ensure_ascii=False)`),
so a schema's valid answers all stay: the tests check both, over generated schemas, on both
versions.

xgrammar only, no torch: the vLLM thinker builds the same grammars in its own environment.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import xgrammar as xgr

from omnistream.engine.ebnf_rewrite import placeholder, strict_ebnf
from omnistream.request.structured import SUBSCHEMA_LIST, SUBSCHEMA_MAP, SUBSCHEMA_ONE

__all__ = ["json_object_ebnf", "json_schema_ebnf", "strict_ebnf", "strict_grammar", "strict_structural_tag"]

# JSON's separators with no whitespace around them (vLLM's disable_any_whitespace).
COMPACT = (",", ":")


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


def _mask_patterns(schema: Any, patterns: list[str]) -> Any:
    """A copy of `schema` whose patterns (`pattern`, `patternProperties`' keys) are placeholders;
    the patterns are appended to `patterns`, placeholder i standing for patterns[i]."""
    if not isinstance(schema, dict):
        return schema

    def mask(pattern: str) -> str:
        patterns.append(pattern)
        return placeholder(len(patterns) - 1)

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
