"""A grammar the thinker's output must follow: the one form every entry point and both thinker
backends speak (tool calls that must happen, a named function, `response_format` JSON).

The gateway turns OpenAI's `tools` / `tool_choice` / `response_format` into one of these; the
transformers thinker enforces it with xgrammar (a token bitmask over the batch each step), the vLLM
thinker hands it to vLLM's structured outputs. Torch-free and xgrammar-free on purpose: the gateway
builds and checks specs without loading either.

Kinds (the spec's text in each):
* `json_schema`: a JSON schema (JSON text); the output is one JSON value that validates.
* `json_object`: any JSON object (spec empty).
* `structural_tag`: xgrammar's structural tag (JSON text, the format vLLM's `structural_tag`
  takes too): how tool calls are enforced, e.g. triggered `<tool_call>` tags whose content is the
  function's arguments schema.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnistream.request.errors import InvalidRequest, InvalidValue

KINDS = ("json_schema", "json_object", "structural_tag")
# A spec larger than this is refused before any compiling (a grammar "too large").
MAX_SPEC_BYTES = 64 * 1024


@dataclass(frozen=True)
class StructuredOutput:
    kind: str
    spec: str = ""

    @property
    def param(self) -> str:
        """The client's parameter this grammar came from, for errors about it (a grammar that does
        not compile, or too slowly): tool calls are structural tags, JSON output is response_format."""
        return "tools" if self.kind == "structural_tag" else "response_format"

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise InvalidRequest(
                f"structured output kind must be one of {', '.join(KINDS)}", field="response_format"
            )
        if len(self.spec.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
            raise InvalidValue(f"the output grammar is over {MAX_SPEC_BYTES} bytes", field="response_format")


# Where a JSON schema holds schemas (JSON Schema 2020-12 and the drafts before it): the keywords
# whose value is one schema, a list of schemas, a map of them (the gateway's enforceability check
# and the engines' grammar rewrite walk a schema by these; never const, enum, default, examples).
SUBSCHEMA_ONE = (
    "additionalProperties",
    "additionalItems",
    "items",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
)
SUBSCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
SUBSCHEMA_MAP = (
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
)
