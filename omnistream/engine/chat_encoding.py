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
"""

from __future__ import annotations

import copy
import re
from typing import Any

from omnistream.request.errors import InvalidRequest
from omnistream.request.media import text_of

ROLES = ("system", "user", "assistant")
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

    def check(self, messages: list[dict[str, Any]]) -> None:
        """Cheap refusals (roles, a prompt that cannot fit) before the costly tokenizing."""
        total = 0
        for i, message in enumerate(messages):
            if message.get("role") not in ROLES:
                raise InvalidRequest(
                    f"messages[{i}].role must be system, user or assistant", field="messages"
                )
            total += len(text_of(message.get("content", "")).encode("utf-8", "surrogatepass"))
        if total > self.max_token_bytes * self.max_prompt_tokens:
            raise InvalidRequest(
                f"the prompt ({total} bytes) cannot fit in {self.max_prompt_tokens} tokens", field="messages"
            )

    def encode(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt ids for a chat (ChatML, generation prompt added); runs off the event loop.

        Media parts render as the template's single placeholders (the processor expands them)."""
        self.check(messages)
        cut: list[str] = []
        escaped = self._escape(messages, cut)
        if not cut and all(isinstance(m.get("content", ""), str) for m in messages):
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(ids if isinstance(ids, list) else ids["input_ids"])
        rendered = self.tokenizer.apply_chat_template(escaped, add_generation_prompt=True, tokenize=False)
        return self.tokenize(rendered, cut)

    def encode_text(self, text: str) -> list[int]:
        """Ids of plain text, as the assistant's words (speech): no template, and special-token
        strings in it are the ordinary tokens of those characters ("text from users is text")."""
        return list(self._plain.encode(text, add_special_tokens=False, split_special_tokens=True))

    def render(self, messages: list[dict[str, Any]]) -> tuple[str, list[str]]:
        """The templated text with the user's special-token strings replaced by stand-ins (`cut`)."""
        cut: list[str] = []
        escaped = self._escape(messages, cut)
        rendered = self.tokenizer.apply_chat_template(escaped, add_generation_prompt=True, tokenize=False)
        return rendered, cut

    def _escape(self, messages: list[dict[str, Any]], cut: list[str]) -> list[dict[str, Any]]:
        return [{**m, "content": self._escape_content(m.get("content", ""), cut)} for m in messages]

    def tokenize(self, rendered: str, cut: list[str]) -> list[int]:
        """Ids of a `render`ed text: the template's special tokens special, the cut-out strings text."""
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

    def _escape_content(self, content: Any, cut: list[str]) -> Any:
        if isinstance(content, str):
            return self._cut_out(content, cut)
        return [
            {**part, "text": self._cut_out(part["text"], cut)} if part.get("type") == "text" else part
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
