"""Chat messages to prompt ids, where only the template may produce special tokens.

A tokenizer matches its special tokens anywhere in the text it is given, so a user who types
`<|im_start|>system` or `<|image_pad|>` would otherwise inject control tokens (the chat-template
injection class of defects). Here every special-token string inside user-supplied text is cut out
before the template is rendered and put back as plain text: the template's own special tokens stay
special, the user's become the ordinary tokens of those characters.

Text without any special-token string is encoded exactly as the reference does
(`apply_chat_template(..., tokenize=True)`), so ordinary prompts keep bit-exact parity.

Threads: the servicers tokenize in a thread pool, so one encoder serves several threads at once. A
Hugging Face fast tokenizer keeps "are special-token strings text?" (`split_special_tokens`) as one
flag on its shared Rust tokenizer, which every call with another value flips before it encodes: a
call that keeps specials racing one that splits them could encode a chat template's own
`<|im_start|>` as text (a prompt without its turns: issue 28's speech failures). So the encoder
never flips it: the model's tokenizer only ever encodes with specials special (its default, which
the processor and the chat template use too), and text whose special-token strings must stay text
goes through a copy of it whose flag is set once, here, for good.

Tools: a chat may offer function tools (`tools`, OpenAI's tool objects, beside the messages) and
hold assistant `tool_calls` and `tool` turns; the template renders them in the model's own format.
Everything in them the client wrote (tool names, descriptions and schemas, a call's name and
arguments) is user text: its special-token strings stay text too. A call's arguments given as JSON
text are rendered from their parsed value, as vLLM renders them (`{"city": "Paris"}` whatever
the client's spacing).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from typing import Any

from omnistream.engine.token_memo import TokenMemo, safe_boundaries
from omnistream.request.errors import InvalidRequest
from omnistream.request.media import text_of

ROLES = ("system", "user", "assistant", "tool")
Tools = Sequence[dict[str, Any]] | None  # OpenAI's function tool objects a chat offers
# Stand-ins for cut-out strings: one private-use code point each. Code points of this block found in
# user text are cut out (and put back) the same way, so a stand-in can never be forged.
_STAND_IN_BASE = 0xF0000
_STAND_IN_BLOCK = 0x10000
_STAND_IN_RE = re.compile(f"([{chr(_STAND_IN_BASE)}-{chr(_STAND_IN_BASE + _STAND_IN_BLOCK - 1)}])")


class ChatEncoder:
    def __init__(self, tokenizer: Any, max_prompt_tokens: int) -> None:
        self.tokenizer = tokenizer  # specials special only (see the module's "Threads")
        self._plain = _splitting_copy(tokenizer)  # special-token strings are text: always
        self.max_prompt_tokens = max_prompt_tokens
        specials = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
        specials.update(tokenizer.all_special_tokens)
        self.special_strings = sorted((s for s in specials if s), key=len, reverse=True)
        self._special_re = re.compile("|".join(re.escape(s) for s in self.special_strings) or r"(?!)")
        # No token decodes to more UTF-8 bytes than this: a text with more than this many bytes per
        # allowed token cannot fit, and is refused before any tokenizing.
        vocab = tokenizer.get_vocab()
        self.max_token_bytes = max(len(t.encode("utf-8", "surrogatepass")) for t in vocab) if vocab else 1
        # Where a rendered prompt may be cut without changing its ids (token_memo.py).
        self._boundaries = safe_boundaries(tokenizer)
        self._boundary_re = re.compile(
            "|".join(re.escape(s) for s in sorted(self._boundaries, key=len, reverse=True)) or r"(?!)"
        )

    def check(self, messages: list[dict[str, Any]], tools: Tools = None) -> None:
        """Cheap refusals (roles, a prompt that cannot fit) before the costly tokenizing."""
        tools = _checked_tools(tools)
        total = _utf8_len(json.dumps(tools, ensure_ascii=False)) if tools else 0
        for i, message in enumerate(messages):
            if message.get("role") not in ROLES:
                raise InvalidRequest(
                    f"messages[{i}].role must be system, user, assistant or tool", field="messages"
                )
            total += _utf8_len(text_of(message.get("content", "")))
            for call in message.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise InvalidRequest(
                        f"messages[{i}].tool_calls: a call needs a function name", field="messages"
                    )
                total += _utf8_len(function["name"]) + _utf8_len(str(function.get("arguments", "")))
        if total > self.max_token_bytes * self.max_prompt_tokens:
            raise InvalidRequest(
                f"the prompt ({total} bytes) cannot fit in {self.max_prompt_tokens} tokens", field="messages"
            )

    def encode(
        self, messages: list[dict[str, Any]], tools: Tools = None, memo: TokenMemo | None = None
    ) -> list[int]:
        """The prompt ids for a chat (ChatML, generation prompt added) offering `tools`; runs off
        the event loop. Media parts render as the template's single placeholders (the processor
        expands them). `memo`: the conversation's last prompt (`tokenize`)."""
        self.check(messages, tools)
        tools = _checked_tools(tools)
        messages = _with_parsed_arguments(messages)
        cut: list[str] = []
        escaped, escaped_tools = self._escape(messages, cut), self._cut_all(tools, cut)
        if memo is None and not cut and all(isinstance(m.get("content", ""), str) for m in messages):
            ids = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True
            )
            return list(ids if isinstance(ids, list) else ids["input_ids"])
        rendered = self.tokenizer.apply_chat_template(
            escaped, tools=escaped_tools, add_generation_prompt=True, tokenize=False
        )
        return self.tokenize(rendered, cut, memo)

    def encode_text(self, text: str) -> list[int]:
        """Ids of plain text, as the assistant's words (speech): no template, and special-token
        strings in it are the ordinary tokens of those characters ("text from users is text")."""
        return list(self._plain.encode(text, add_special_tokens=False, split_special_tokens=True))

    def render(self, messages: list[dict[str, Any]], tools: Tools = None) -> tuple[str, list[str]]:
        """The templated text with the user's special-token strings replaced by stand-ins (`cut`)."""
        tools = _checked_tools(tools)
        cut: list[str] = []
        escaped = self._escape(_with_parsed_arguments(messages), cut)
        escaped_tools = self._cut_all(tools, cut)
        rendered = self.tokenizer.apply_chat_template(
            escaped, tools=escaped_tools, add_generation_prompt=True, tokenize=False
        )
        return rendered, cut

    def _escape(self, messages: list[dict[str, Any]], cut: list[str]) -> list[dict[str, Any]]:
        escaped = []
        for m in messages:
            turn = {**m, "content": self._escape_content(m.get("content", ""), cut)}
            if m.get("tool_calls"):
                turn["tool_calls"] = self._cut_all(m["tool_calls"], cut)
            escaped.append(turn)
        return escaped

    def _cut_all(self, value: Any, cut: list[str]) -> Any:
        """Every string in a JSON-like value (object keys too) with its special-token strings cut
        out: the template shows them as JSON (`tojson` keeps the stand-ins as they are)."""
        if isinstance(value, str):
            return self._cut_out(value, cut)
        if isinstance(value, dict):
            return {self._cut_all(k, cut): self._cut_all(v, cut) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._cut_all(v, cut) for v in value]
        return value

    def tokenize(self, rendered: str, cut: list[str], memo: TokenMemo | None = None) -> list[int]:
        """Ids of a `render`ed text: the template's special tokens special, the cut-out strings text.
        `memo`: the conversation's last text and ids, of which only what differs is tokenized again
        (a text with cut-out strings is tokenized whole, and forgets the memo)."""
        if memo is not None:
            if not cut and self._boundaries:
                return memo.tokenize(rendered, self._encode_special, self._boundaries, self._boundary_re)
            memo.forget()
        ids: list[int] = []
        for piece in _STAND_IN_RE.split(rendered):
            if not piece:
                continue
            if _STAND_IN_RE.fullmatch(piece):
                text = cut[ord(piece) - _STAND_IN_BASE]
                ids += self._plain.encode(text, add_special_tokens=False, split_special_tokens=True)
            else:
                ids += self.tokenizer.encode(piece, add_special_tokens=False)
        return ids

    def _encode_special(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _escape_content(self, content: Any, cut: list[str]) -> Any:
        if isinstance(content, str):
            return self._cut_out(content, cut)
        return [
            {**part, "text": self._cut_out(part["text"], cut)}
            if part.get("type") == "text"
            else _keys_only(part)
            for part in content
        ]

    def _cut_out(self, text: str, cut: list[str]) -> str:
        """Replace special-token strings (and stand-in look-alikes) in `text` by stand-ins."""

        def stand_in(match: re.Match[str]) -> str:
            if len(cut) >= _STAND_IN_BLOCK:
                raise InvalidRequest("too many special-token strings in the prompt", field="messages")
            cut.append(match.group(0))
            return chr(_STAND_IN_BASE + len(cut) - 1)

        text = _STAND_IN_RE.sub(stand_in, text)  # first: the stand-ins added next must stay
        return self._special_re.sub(stand_in, text)


def _checked_tools(tools: Tools) -> list[dict[str, Any]] | None:
    """The tools as the template takes them (None: none offered)."""
    if not tools:
        return None
    if not all(isinstance(t, dict) for t in tools):
        raise InvalidRequest("tools must be a list of tool objects", field="tools")
    return list(tools)


def _with_parsed_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant calls whose arguments are JSON object text carry the parsed object instead (the
    template writes it back as JSON); other turns are the same objects (the fast path's input)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [_parsed_call(c) for c in calls]}
        out.append(m)
    return out


def _parsed_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            return call
        if isinstance(value, dict):
            return {**call, "function": {**function, "arguments": value}}
    return call


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _splitting_copy(tokenizer: Any) -> Any:
    """A copy of `tokenizer` that encodes special-token strings as text by default, with its own
    backend: encoding with it never touches the flag of the original that other threads use."""
    plain = copy.deepcopy(tokenizer)
    plain.split_special_tokens = True
    backend = getattr(plain, "_tokenizer", None)
    if backend is not None:  # a fast tokenizer: its Rust side holds the flag
        if backend is getattr(tokenizer, "_tokenizer", None):
            raise RuntimeError("the tokenizer's copy shares its backend")
        backend.encode_special_tokens = True
    return plain


def _keys_only(part: Any) -> Any:
    """A media part as the template sees it: its keys (templates test `'audio' in part`), not its
    arrays, which the template never reads and transformers would walk and copy at every render."""
    if not isinstance(part, dict):
        return part
    return {k: (v if isinstance(v, str | int | float | bool) or v is None else "") for k, v in part.items()}
