"""Incremental detokenisation that never splits a UTF-8 character.

Byte-level BPE tokens can end in the middle of a multi-byte character; decoding token by token
would emit U+FFFD and then the rest. We decode a small window of recent tokens and only release
text once it no longer ends in a replacement character (the approach of TGI and vLLM).
"""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """One request's text, released as whole characters."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the window already released as text
        self._read = 0  # end of the window already released

    def _decode(self, ids: list[int]) -> str:
        text: str = self._tok.decode(ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False)
        return text

    def add(self, token_id: int) -> str:
        """Append one token; return the newly complete text (possibly empty)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self._prefix = self._read
            self._read = len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """At end of stream, release whatever is left (invalid bytes become U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :]
