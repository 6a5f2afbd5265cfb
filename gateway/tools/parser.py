"""The tool calls in a model's streamed text, in Qwen3's (hermes) format:

    Let me look.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`ToolCallParser` takes the text as it streams and gives back pieces: `TextPiece`s of the words
outside the calls, and per call `CallPiece`s, its id and name first, then its arguments (a JSON
text) in pieces: what OpenAI streams as `delta.tool_calls` and the realtime API as
`response.function_call_arguments.delta`. A whole answer is the same pieces joined, so a
non-streamed answer equals its streamed one by construction.

Two ways to read a call, chosen by the caller (`ToolUse.enforced_calls`):

* enforced (a grammar made the output, `required` or a named function): every call is well formed,
  so its arguments stream as they arrive (held back only by what may still be the call's closing
  `}` and `</tool_call>`); the grammar allows no words, so everything outside a call is markup
  (the separators between calls, or the start of a call the answer was cut in) and never text;
* not enforced (`auto`): a call is held until its `</tool_call>` and given only if it parses: a JSON
  object with a `name` among the offered functions and object `arguments` (written back as
  `json.dumps` does). Anything else, an unfinished call included, stays text.

An answer cut short (max_tokens) inside an enforced call keeps the arguments that came: whole when
only the call's closing was missing, else cut (not valid JSON, as OpenAI's may be on
`finish_reason: "length"`); one cut before the call's name came (`<tool_ca`, `<tool_call>\n{"na`)
gives nothing for it, neither a call nor words.

Blanks next to a call (the newline before `<tool_call>`, after `</tool_call>`, between calls) are
markup, not words: they are dropped, as the talker leaves them unspoken.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass

from gateway.tools.spec import CALL_END_TAG, CALL_START

_NAME_PREFIX = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*')
_BLANKS = " \t\r\n"


@dataclass(frozen=True)
class TextPiece:
    text: str


@dataclass(frozen=True)
class CallPiece:
    """A piece of call `index` (0, 1, ... in the answer): the first has its `id` and `name` (and
    empty `arguments`), the later ones more of its arguments."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


Piece = TextPiece | CallPiece


@dataclass
class ToolCall:
    """A call as its pieces so far make it."""

    id: str
    name: str
    arguments: str = ""


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


class ToolCallParser:
    """One answer's parser: `feed` each text delta, then `finish` once; `calls` and `text` hold the
    whole answer so far."""

    def __init__(
        self, names: Collection[str], enforced: bool = False, new_id: Callable[[], str] = new_call_id
    ) -> None:
        self.names = frozenset(names)
        self.enforced = enforced
        self.new_id = new_id
        self.calls: list[ToolCall] = []
        self.text = ""
        self._pending = ""  # received, not yet decided
        self._blank = ""  # trailing blanks of the text given so far: words or a call's margin
        self._after_call = False  # blanks that follow now are a call's margin
        self._in_call = False
        self._call = ""  # the current call's text after <tool_call>
        self._streaming: ToolCall | None = None  # enforced: the call whose arguments stream
        self._sent = 0  # of the streaming call's arguments region

    def feed(self, delta: str) -> list[Piece]:
        self._pending += delta
        return self._advance(final=False)

    def finish(self) -> list[Piece]:
        """The pieces held back: the end of the text, an unfinished call (text, unless its
        arguments were streaming; enforced, a call cut before its name is markup, not words)."""
        out = self._advance(final=True)
        if self._in_call:
            if self._streaming is not None:
                out += self._arguments(self._cut_arguments())
            else:
                out += self._words(CALL_START + self._call, final=True)
            self._in_call, self._call, self._streaming = False, "", None
        out += self._words("", final=True)
        return out

    # --- text ------------------------------------------------------------------------------------
    def _advance(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        while True:
            if self._in_call:
                self._call += self._pending
                self._pending = ""
                done = self._in_call_step(out)
                if not done:
                    return out
                continue
            start = self._pending.find(CALL_START)
            if start < 0:
                keep = 0 if final else _partial_suffix(self._pending, CALL_START)
                cut = len(self._pending) - keep
                text, self._pending = self._pending[:cut], self._pending[cut:]
                out += self._words(text, final=False)
                return out
            out += self._words(self._pending[:start], final=False)
            self._pending = self._pending[start + len(CALL_START) :]
            self._in_call, self._call = True, ""

    def _words(self, text: str, final: bool) -> list[Piece]:
        """Text outside calls; its trailing blanks wait to see whether a call follows. Enforced,
        none of it is words (see the module doc)."""
        if self.enforced:
            return []
        if self._after_call:
            text = text.lstrip(_BLANKS)
            if not text:
                if final:
                    self._blank = ""
                return []
            self._after_call = False
        text = self._blank + text
        body = text if final else text.rstrip(_BLANKS)
        self._blank = text[len(body) :]
        if not body:
            return []
        self.text += body
        return [TextPiece(body)]

    # --- calls -----------------------------------------------------------------------------------
    def _in_call_step(self, out: list[Piece]) -> bool:
        """Progress on the current call; True when it ended (the rest is back in `_pending`)."""
        end = self._call.find(CALL_END_TAG)
        if self.enforced and self._streaming is None:
            match = _NAME_PREFIX.match(self._call)
            if match and match.group(1) in self.names:
                self._blank = ""  # the margin before an enforced call: it is a call
                started = ToolCall(self.new_id(), match.group(1))
                self.calls.append(started)
                self._streaming, self._sent = started, match.end()
                out.append(CallPiece(len(self.calls) - 1, id=started.id, name=started.name))
        if self._streaming is not None:
            region = self._call[self._sent : end if end >= 0 else len(self._call)]
            keep = _closing_suffix(region, whole=end >= 0)
            out += self._arguments(region[: len(region) - keep])
            if end < 0:
                return False
            self._close_call(end)
            return True
        if end < 0:
            return False
        body = self._call[:end]
        call = self._parsed(body)
        if call is None:  # not a call: its text stays, margins included
            out += self._words(CALL_START + body + CALL_END_TAG, final=False)
        else:
            self._blank = ""
            self.calls.append(call)
            index = len(self.calls) - 1
            out.append(CallPiece(index, id=call.id, name=call.name))
            out.append(CallPiece(index, arguments=call.arguments))
        if call is not None:
            self._close_call(end)
        else:
            self._pending = self._call[end + len(CALL_END_TAG) :] + self._pending
            self._in_call, self._call = False, ""
        return True

    def _arguments(self, text: str) -> list[Piece]:
        if self._streaming is None:
            return []
        if not self._streaming.arguments:  # blanks before the arguments' JSON are the call's
            blanks = len(text) - len(text.lstrip(_BLANKS))
            self._sent += blanks
            text = text[blanks:]
        if not text:
            return []
        self._streaming.arguments += text
        self._sent += len(text)
        return [CallPiece(len(self.calls) - 1, arguments=text)]

    def _cut_arguments(self) -> str:
        """The rest of a streaming call's arguments when the answer ends inside the call: without
        its closing (`}` and the start of `</tool_call>`) when that leaves them whole JSON,
        else everything that came."""
        assert self._streaming is not None
        region = self._call[self._sent :]
        closed = region[: len(region) - _closing_suffix(region, whole=False)]
        for rest in (closed, region[: len(region) - _partial_suffix(region, CALL_END_TAG)].rstrip(_BLANKS)):
            try:
                json.loads(self._streaming.arguments + rest)
            except ValueError:
                continue
            return rest
        return region

    def _close_call(self, end: int) -> None:
        self._pending = self._call[end + len(CALL_END_TAG) :] + self._pending
        self._in_call, self._call, self._streaming = False, "", None
        self._after_call = True

    def _parsed(self, body: str) -> ToolCall | None:
        try:
            value = json.loads(body)
        except ValueError:
            return None
        if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
            return None
        name, arguments = value["name"], value["arguments"]
        if not isinstance(name, str) or name not in self.names or not isinstance(arguments, dict):
            return None
        return ToolCall(self.new_id(), name, json.dumps(arguments, ensure_ascii=False))


def _partial_suffix(text: str, token: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `token`."""
    for n in range(min(len(text), len(token) - 1), 0, -1):
        if text.endswith(token[:n]):
            return n
    return 0


def _closing_suffix(region: str, whole: bool) -> int:
    """How much of the end of a streaming call's arguments region may be the call's own closing
    (blanks, its `}`, blanks, the start of `</tool_call>`); `whole`: the region is complete (its
    `</tool_call>` came), so its closing `}` is there."""
    n = len(region)
    if not whole:
        n -= _partial_suffix(region, CALL_END_TAG)
    stripped = region[:n].rstrip(_BLANKS)
    if stripped.endswith("}"):
        stripped = stripped[:-1].rstrip(_BLANKS)
    return len(region) - len(stripped)
