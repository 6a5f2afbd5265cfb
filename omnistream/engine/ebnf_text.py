"""Reading and writing xgrammar's EBNF text: its string literals and character classes, and the
sets of characters a class admits (sorted, disjoint, inclusive ranges of code points). What the strict
JSON rewrite (ebnf_rewrite.py) reads a grammar's rules with and writes its rewritten ones with."""

from __future__ import annotations

_MAX_CHAR = 0x10FFFF  # the largest code point

Ranges = list[tuple[int, int]]


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


def read_literal(text: str, i: int) -> tuple[int, str]:
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


def read_class(text: str, i: int) -> tuple[int, bool, Ranges]:
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


def group_end(text: str, i: int) -> int:
    """The index after the group opened at text[i] ('('), literals and classes skipped."""
    depth = 0
    j = i
    while True:
        c = text[j]
        if c == '"':
            j, _ = read_literal(text, j)
            continue
        if c == "[":
            j, _, _ = read_class(text, j)
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


def literal(text: str) -> str:
    return '"' + "".join(_char_text(ord(c), False) for c in text) + '"'


def _ranges_text(ranges: Ranges) -> str:
    return "".join(
        _char_text(low, True) + ("" if low == high else "-" + _char_text(high, True)) for low, high in ranges
    )


def class_text(ranges: Ranges) -> str:
    """A class admitting `ranges` (the shorter of the positive and the negated form)."""
    outside = complement(ranges)
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


def complement(ranges: Ranges) -> Ranges:
    out: Ranges = []
    start = 0
    for low, high in _normal(ranges):
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= _MAX_CHAR:
        out.append((start, _MAX_CHAR))
    return out


def intersect(a: Ranges, b: Ranges) -> Ranges:
    return _normal([(max(x, y), min(p, q)) for x, p in a for y, q in b if max(x, y) <= min(p, q)])


def subtract(a: Ranges, b: Ranges) -> Ranges:
    return intersect(a, complement(b))


def contains(ranges: Ranges, code: int) -> bool:
    return any(low <= code <= high for low, high in ranges)


def members(ranges: Ranges) -> list[int]:
    return [c for low, high in ranges for c in range(low, high + 1)]
