"""Which of the thinker's output tokens the talker speaks: the answer's words, never a tool call.

A voice assistant that calls a function writes the call into its answer (Qwen3 and hermes:
`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`); a listener must hear the words
around it and nothing of the markup or the JSON. The thinker knows its tokenizer, so it decides,
per request, with a `SpokenFilter`, and tells the gateway in each ThinkerChunk (`spoken`); the
gateway (or the in-process pipeline) hands the talker only those tokens. One place decides, for
both thinker backends and both runners.

The rules, made so that the words of an answer with a call are spoken exactly as the same words
without it (the talker's codes depend only on the tokens it gets):
* a call runs from the open marker through the close marker, found in the tokens' text, so a
  marker that is one token (Qwen3's tokenizer, the tiny one) and a marker spelled over several text
  tokens (a given answer, a tokenizer without the token) are found alike; a token that holds any
  character of a call is not spoken;
* blanks (whitespace tokens) next to a call are not spoken either: those before it are held until
  the next token shows whether a call follows, those right after it are dropped;
* an answer with a call and no word says nothing: not even its end-of-turn token, so the talker
  ends at once with no audio;
* an answer without a call is spoken whole, token for token (held blanks and a held start of an
  open marker are released in order, at its end too: as the gateway's parser shows them as text);
* a structured answer (JSON, `response_format`) is never spoken, nor one whose grammar allows calls
  alone (`calls_only`: `required`, a named function): all of it is markup, even the start of a
  call the answer was cut in (`<tool_ca`). A grammar that allows free text around its calls (a
  gRPC client's own structural tag: xgrammar's `triggered_tags`, its older `structures` form) is
  read by the rules above, its words spoken.

Torch-free and model-neutral: the gateway's tests and the pipeline use it without a model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from omnistream.request.structured import StructuredOutput

# The hermes / Qwen3 tool-call markers (the format the gateway's tool-call parser reads).
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
# Structured outputs whose whole answer is data, not speech.
SILENT_KINDS = frozenset({"json_schema", "json_object"})


def silent_for(structured: StructuredOutput | None) -> bool:
    """Is a request with this structured output never spoken (its answer is JSON, or calls alone)?"""
    return structured is not None and (structured.kind in SILENT_KINDS or calls_only(structured))


def calls_only(structured: StructuredOutput | None) -> bool:
    """Does the grammar allow tool calls alone, no words: a structural tag whose format is one call
    tag or call tags with blank separators (what gateway/tools/spec.py makes for `required` and a
    named function)? Any other format may hold free text (False)."""
    if structured is None or structured.kind != "structural_tag":
        return False
    try:
        spec = json.loads(structured.spec)
    except ValueError:
        return False
    form = spec.get("format") if isinstance(spec, dict) else None
    if not isinstance(form, dict):
        return False
    tags: Any = None
    if form.get("type") == "tag":
        tags = [form]
    elif form.get("type") == "tags_with_separator" and str(form.get("separator", "")).strip() == "":
        tags = form.get("tags")
    return (
        isinstance(tags, list)
        and bool(tags)
        and all(isinstance(t, dict) and str(t.get("begin", "")).startswith(CALL_OPEN) for t in tags)
    )


class _Tokenizer(Protocol):
    """What `TokenPieces` reads of a Hugging Face tokenizer."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class TokenPieces:
    """Each token id's own text, as the filter reads it, cached per id (one per thinker).

    A marker that is a single token is its marker text whatever the tokenizer's decode does with it
    (a special token would decode to nothing); other special tokens (the end of turn) are "".
    """

    def __init__(self, tokenizer: _Tokenizer, markers: Iterable[str] = (CALL_OPEN, CALL_CLOSE)) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}
        self.marker_ids: dict[str, int] = {}
        for marker in markers:
            ids = tokenizer.encode(marker, add_special_tokens=False)
            if len(ids) == 1:
                self.marker_ids[marker] = ids[0]
                self._texts[ids[0]] = marker

    def text(self, token_id: int) -> str:
        piece = self._texts.get(token_id)
        if piece is None:
            piece = self._tokenizer.decode([token_id], skip_special_tokens=True)
            self._texts[token_id] = piece
        return piece

    def filter(self, structured: StructuredOutput | None = None) -> SpokenFilter:
        """A new request's filter (silent for a JSON answer or calls alone)."""
        return SpokenFilter(self.text, silent=silent_for(structured))


# What the scanner says of a token.
_OUT, _CALL = "out", "call"


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


@dataclass
class _CallScanner:
    """Finds the calls in a token stream by text. Outside a call a token is held while the text
    ends with what may be the start of an open marker; inside, every token is the call's, and the
    last characters are kept to find a close marker split over tokens."""

    open: str = CALL_OPEN
    close: str = CALL_CLOSE
    inside: bool = False
    held: list[tuple[int, str]] = field(default_factory=list)
    skip: int = 0  # inside: characters at the start of `held`'s text before the search starts
    carry: str = ""  # inside: the call's last characters already emitted (a split close marker)

    def push(self, token_id: int, text: str) -> list[tuple[str, int, str]]:
        """(kind, token, text) for the tokens decided now, in order; "open"/"close" events (token
        -1) mark where a call starts and ends."""
        self.held.append((token_id, text))
        return self._scan()

    def finish(self) -> list[tuple[str, int, str]]:
        """Whatever is still held is text (an open marker never completed)."""
        held, self.held = self.held, []
        kind = _CALL if self.inside else _OUT
        return [(kind, t, s) for t, s in held]

    def _scan(self) -> list[tuple[str, int, str]]:
        events: list[tuple[str, int, str]] = []
        while self.held:
            text = "".join(s for _, s in self.held)
            if self.inside:
                # `skip` is set only on entry (then `carry` is empty): the open marker is no close.
                search = self.carry + text
                at = search.find(self.close, self.skip)
                if at < 0:
                    events += [(_CALL, t, s) for t, s in self.held]
                    self.carry = search[max(self.skip, len(search) - len(self.close) + 1) :]
                    self.held, self.skip = [], 0
                    break
                end = at + len(self.close) - len(self.carry)  # in `text`
                taken = _tokens_before(self.held, end, inclusive=True)
                events += [(_CALL, t, s) for t, s in self.held[:taken]]
                events.append(("close", -1, ""))
                self.held = self.held[taken:]
                self.inside, self.carry, self.skip = False, "", 0
                continue
            at = text.find(self.open)
            if at < 0:
                keep_from = len(text) - _partial_suffix(text, self.open)
                taken = _tokens_before(self.held, keep_from, inclusive=False)
                events += [(_OUT, t, s) for t, s in self.held[:taken]]
                self.held = self.held[taken:]
                break
            taken = _tokens_before(self.held, at, inclusive=False)
            events += [(_OUT, t, s) for t, s in self.held[:taken]]
            events.append(("open", -1, ""))
            consumed = sum(len(s) for _, s in self.held[:taken])
            self.held = self.held[taken:]
            self.inside, self.carry = True, ""
            self.skip = at - consumed + len(self.open)
        return events


def _tokens_before(held: list[tuple[int, str]], offset: int, inclusive: bool) -> int:
    """How many leading tokens of `held` end at or before character `offset` of its text, or, with
    `inclusive`, start before it (the token holding the character just before `offset` too)."""
    pos = 0
    for n, (_, s) in enumerate(held):
        start, pos = pos, pos + len(s)
        if (start >= offset) if inclusive else (pos > offset):
            return n
    return len(held)


class SpokenFilter:
    """One request's state: thinker tokens in (`push`, chunk by chunk; `finish` at the end), the
    tokens to speak out, possibly later than they came (held blanks)."""

    def __init__(self, text_of: Callable[[int], str], silent: bool = False) -> None:
        self._text_of = text_of
        self.silent = silent
        self._scanner = _CallScanner()
        self._pending: list[int] = []  # blanks and special tokens waiting for the next word
        self._after_call = False  # blanks now follow a call: dropped
        self.spoke = False  # a word was spoken
        self.calls = 0  # calls seen (opened)

    def push(self, token_ids: Iterable[int]) -> list[int]:
        out: list[int] = []
        if self.silent:
            return out
        for token in token_ids:
            for kind, t, text in self._scanner.push(token, self._text_of(token)):
                self._take(kind, t, text, out)
        return out

    def finish(self) -> list[int]:
        """The output ended: what is still held. Held blanks are spoken after words, or when the
        answer had no call (every token of such an answer is spoken); after a call alone, nothing."""
        out: list[int] = []
        if self.silent:
            return out
        for kind, t, text in self._scanner.finish():
            self._take(kind, t, text, out)
        if self.spoke or not self.calls:
            out += self._pending
        self._pending = []
        return out

    def _take(self, kind: str, token: int, text: str, out: list[int]) -> None:
        if kind == "open":
            self.calls += 1
            self._pending = []  # blanks before a call are the call's
        elif kind == "close":
            self._after_call = True
        elif kind == _CALL:
            return
        elif text == "":  # a special token (the end of turn): spoken once there are words
            self._pending.append(token)
        elif text.isspace():
            if not self._after_call:
                self._pending.append(token)
        else:
            out += self._pending
            out.append(token)
            self._pending = []
            self._after_call = False
            self.spoke = True


def spoken_of(tokenizer: Any, token_ids: list[int], structured: StructuredOutput | None = None) -> list[int]:
    """The tokens of a whole answer that are spoken (tests, tools)."""
    f = TokenPieces(tokenizer).filter(structured)
    return f.push(token_ids) + f.finish()
