"""The rewrite of xgrammar's printed EBNF of a JSON value into a grammar of strict, compact JSON only
(json_grammar.py says why, and what xgrammar's own grammars take that strict JSON does not).

The rewrite is generic, over every rule xgrammar emits: no class or literal takes a raw control
character anywhere (compact JSON has none, in a string or between tokens) nor a surrogate; a class
that takes a raw `"` or backslash inside a string takes its escape instead; a length-bounded string's
characters take JSON's escapes; a pattern is matched by the string's decoded text (the pattern's own
rules, each character JSON must escape written escaped); a separator has no blank around it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

import xgrammar as xgr

from omnistream.engine.ebnf_text import (
    Ranges,
    class_text,
    complement,
    contains,
    group_end,
    intersect,
    literal,
    members,
    read_class,
    read_literal,
    subtract,
)

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
_STRUCTURAL = set(",:[]{}")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RULE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) ::= (.*)$")


def placeholder(index: int) -> str:
    """The pattern xgrammar is given for the schema's pattern `index` (one it writes as a `Regex`)."""
    return f"^(OmnistreamPattern{index}Q)+$"


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
        self.placeholders = {placeholder(i): pattern for i, pattern in enumerate(patterns)}
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
                end, text = read_literal(body, i)
                if decoded:
                    out.append(literal(_json_encoded(text)))
                else:
                    text, escaping = _strict_text_literal(text, escaping)
                    out.append(literal(text))
                i = end
                continue
            if c == "[":
                end, negated, ranges = read_class(body, i)
                out.append(self._class(body[i:end], negated, ranges, decoded, escaping))
                escaping = False
                i = end
                continue
            escaping = False
            if body.startswith("(=", i):  # a lookahead: it only ever narrows, kept as written
                end = group_end(body, i)
                out.append(body[i:end])
                i = end
                continue
            ident = _IDENT.match(body, i)
            if ident is not None:
                end = ident.end()
                if end < len(body) and body[end] == "(":
                    if ident.group() != "Regex":
                        raise ValueError(f"unexpected grammar construct {ident.group()}(...)")
                    close = group_end(body, end)
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
        written_set = complement(ranges) if negated else ranges
        allowed = subtract(written_set, _SURROGATES)  # no UTF-8 text holds one
        if not decoded and (
            escaping or (subtract(allowed, _ESCAPE_LETTERS) == [] and intersect(allowed, _QUOTE_BACKSLASH))
        ):
            # The character after a backslash (a class of escape letters, as xgrammar's
            # `basic_escape` starts): one of JSON's one-character escapes.
            kept = intersect(allowed, _ESCAPE_CHARS)
            if not kept:
                raise ValueError("an escape of the grammar admits no JSON escape")
            return written if kept == written_set else class_text(kept)
        bad = intersect(allowed, _MUST_ESCAPE)
        if not bad:
            return written if allowed == written_set else class_text(allowed)
        raw = subtract(allowed, _MUST_ESCAPE)
        alternatives = [class_text(raw)] if raw else []
        if decoded or intersect(bad, _QUOTE_BACKSLASH):
            # A string's decoded characters (a pattern's; a format's that xgrammar writes as such):
            # the ones JSON must escape, escaped.
            alternatives += [literal(_json_encoded(chr(c))) for c in members(bad)]
        elif negated and contains(ranges, 0x22) and contains(ranges, 0x5C):
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
        end, pattern = read_literal(arguments, arguments.index('"'))
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
            end, _ = read_literal(body, i)
        elif c == "[":
            end, _, _ = read_class(body, i)
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
