"""A conversation's last prompt text and ids, so that its next prompt tokenizes only what is new.

Each turn of a conversation renders its whole history again, and tokenizing that text grows with
the history (0.4 ms of a turn's time to first text at twenty spoken turns on the tiny checkpoint,
where the prefix cache spares the rest). The next turn's text begins with most of the last one's,
so only the text after their common part needs tokenizing, provided the ids do not depend on where
the text is cut. They do not at the end of a special token: a fast tokenizer first splits its text
at the added tokens (leftmost, longest), then tokenizes each piece alone, so ids(A + B) =
ids(A) + ids(B) when A ends with a special token that no added token can extend or overlap
(`safe_boundaries` checks that of the vocabulary: special, not normalized, not stripping
whitespace, and no other added token containing it or starting with the end of it).

A memo belongs to one cache scope (one realtime session, whose secret scope no one else sends):
one session's text never decides how fast another's is tokenized. Exactness is tested against the
tokenizer on whole texts (tests/unit/engine/test_token_memo.py).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

MAX_SCOPES = 4096  # memos kept, least recently used dropped first (each a prompt's text and ids)

Encode = Callable[[str], list[int]]


def safe_boundaries(tokenizer: Any) -> dict[str, int]:
    """The special tokens after which a text may be cut without changing its ids (string -> id);
    empty when the tokenizer is not one that splits at added tokens first."""
    if getattr(tokenizer, "_tokenizer", None) is None or getattr(tokenizer, "split_special_tokens", False):
        return {}
    added = {t.content: (i, t) for i, t in tokenizer.added_tokens_decoder.items() if t.content}
    safe: dict[str, int] = {}
    for text, (ident, token) in added.items():
        if not token.special or token.normalized or token.lstrip or token.rstrip or token.single_word:
            continue
        suffixes = [text[k:] for k in range(1, len(text))]
        if any(
            other != text and (text in other or any(other.startswith(s) for s in suffixes)) for other in added
        ):
            continue
        safe[text] = ident
    return safe


class TokenMemo:
    """One scope's last tokenized text, its ids, and where its safe cuts are: (characters, ids)."""

    def __init__(self) -> None:
        self._last: tuple[str, list[int], list[tuple[int, int]]] | None = None
        self._lock = threading.Lock()

    def tokenize(
        self, text: str, encode: Encode, boundaries: dict[str, int], pattern: re.Pattern[str]
    ) -> list[int]:
        """The ids of `text` (`encode`'s), taken from the last text up to the longest safe cut the two
        share; the rest encoded. `pattern` matches the `boundaries` strings, longest first."""
        with self._lock:
            last = self._last
        chars, ids, cuts = 0, list[int](), list[tuple[int, int]]()
        if last is not None:
            chars, ids, cuts = _shared(text, *last)
        tail = encode(text[chars:])
        new_cuts = _cuts(text[chars:], tail, boundaries, pattern)
        if new_cuts is not None:
            cuts = cuts + [(chars + c, len(ids) + i) for c, i in new_cuts]
            with self._lock:
                self._last = (text, ids + tail, cuts)
        return ids + tail

    def forget(self) -> None:
        with self._lock:
            self._last = None


Cut = tuple[int, int]  # (characters, ids) of a text up to just after a boundary token


def _shared(text: str, last: str, ids: list[int], cuts: list[Cut]) -> tuple[int, list[int], list[Cut]]:
    """The longest cut of `last` whose text `text` starts with: (its characters, the ids before it,
    the cuts up to it). The cuts' prefixes match up to some point and no further, so the last cut is
    tried first (a conversation's usual case), then a binary search."""

    def shared(k: int) -> bool:
        return text.startswith(last[: cuts[k][0]])

    if not cuts:
        return 0, [], []
    if shared(len(cuts) - 1):
        found = len(cuts)
    else:
        lo, hi = 0, len(cuts) - 1  # the answer (how many cuts are shared) lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if shared(mid - 1):
                lo = mid
            else:
                hi = mid - 1
        found = lo
    if found == 0:
        return 0, [], []
    chars, count = cuts[found - 1]
    return chars, ids[:count], cuts[:found]


def _cuts(
    text: str, ids: list[int], boundaries: dict[str, int], pattern: re.Pattern[str]
) -> list[tuple[int, int]] | None:
    """(characters, ids) after each boundary token of `text`, whose ids are `ids`; None when the
    two do not pair up one to one (then nothing is remembered)."""
    ends = [m.end() for m in pattern.finditer(text)]
    wanted = set(boundaries.values())
    after = [i + 1 for i, t in enumerate(ids) if t in wanted]
    if len(ends) != len(after):
        return None
    return list(zip(ends, after, strict=True))


class ScopeTokenMemos:
    """Each cache scope's memo, at most `max_scopes` of them (LRU); a released scope's goes at once."""

    def __init__(self, max_scopes: int = MAX_SCOPES) -> None:
        self.max_scopes = max_scopes
        self._memos: OrderedDict[bytes, TokenMemo] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, scope: bytes) -> TokenMemo | None:
        """The scope's memo (made on first use); None for the shared scope b"": unscoped requests
        keep nothing of each other."""
        if not scope:
            return None
        with self._lock:
            memo = self._memos.get(scope)
            if memo is None:
                memo = self._memos[scope] = TokenMemo()
                while len(self._memos) > self.max_scopes:
                    self._memos.popitem(last=False)
            else:
                self._memos.move_to_end(scope)
            return memo

    def release(self, scope: bytes) -> None:
        with self._lock:
            self._memos.pop(scope, None)

    def __len__(self) -> int:
        return len(self._memos)
