"""A conversation's token memo: every turn's ids are exactly the tokenizer's ids of its whole text,
whatever the turn changed; only a scope's own requests share its memo."""

from __future__ import annotations

import copy

import pytest
from tokenizers import AddedToken

from omnistream.engine.token_memo import ScopeTokenMemos, TokenMemo, safe_boundaries


def _whole(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


class CountingEncode:
    """The tokenizer's encode, recording what text it was given."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.texts: list[str] = []

    def __call__(self, text: str) -> list[int]:
        self.texts.append(text)
        return _whole(self.tokenizer, text)


def _conversation(tokenizer, turns: list[tuple[str, str]], ask: str) -> str:
    messages = [{"role": "system", "content": "Be brief."}]
    for user, answer in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": ask})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


TURNS = [
    ("Hello there!", "Hi. How can I help?"),
    ("What is  the weather\tlike?\n\n", "  Sunny, 21 °C; a light breeze 🌬️."),
    ("Und auf Deutsch? Ça va? 日本語で", "Sonnig. Ça va bien. 晴れです。"),
    ('<b>html</b> and `code` {"json": [1, 2]}', "Done:\n```\nx = 1\n```\n"),
]


def test_each_turn_is_the_tokenizer_s_ids_of_the_whole_text_and_only_the_new_text_is_encoded(
    tokenizer, encoder
):
    boundaries = safe_boundaries(tokenizer)
    assert {"<|im_start|>", "<|im_end|>"} <= set(boundaries)
    memo, encode = TokenMemo(), CountingEncode(tokenizer)
    last = ""
    for turn in range(len(TURNS) + 1):
        ask = TURNS[turn][0] if turn < len(TURNS) else "The end?"
        text = _conversation(tokenizer, TURNS[:turn], ask)
        assert memo.tokenize(text, encode, boundaries, encoder._boundary_re) == _whole(tokenizer, text)
        # The last prompt up to its generation prompt's <|im_start|> was not encoded again.
        assert encode.texts[-1] == (text[len(last) - len("assistant\n") :] if turn else text)
        last = text


@pytest.mark.parametrize(
    "change",
    ["an earlier turn deleted", "an earlier answer truncated", "the system prompt changed", "nothing shared"],
)
def test_a_turn_that_changes_the_history_still_gets_the_whole_text_s_ids(tokenizer, encoder, change):
    boundaries = safe_boundaries(tokenizer)
    memo, encode = TokenMemo(), CountingEncode(tokenizer)
    first = _conversation(tokenizer, TURNS, "Go on.")
    memo.tokenize(first, encode, boundaries, encoder._boundary_re)
    turns = list(TURNS)
    if change == "an earlier turn deleted":
        del turns[1]
    elif change == "an earlier answer truncated":
        turns[2] = (turns[2][0], turns[2][1][:5])
    text = _conversation(tokenizer, turns, "Go on.")
    if change == "the system prompt changed":
        text = text.replace("Be brief.", "Be very brief.")
    elif change == "nothing shared":
        text = "plain text without any special token, then <|im_end|> at last"
    assert memo.tokenize(text, encode, boundaries, encoder._boundary_re) == _whole(tokenizer, text)
    # and the turn after it builds on the changed text
    after = text + "<|im_start|>user\nmore<|im_end|>\n"
    assert memo.tokenize(after, encode, boundaries, encoder._boundary_re) == _whole(tokenizer, after)
    cut = max(m.end() for m in encoder._boundary_re.finditer(text))  # the text's last boundary
    assert encode.texts[-1] == after[cut:]


def test_an_added_token_that_could_cross_a_cut_makes_that_token_no_boundary(tokenizer):
    overlapping = copy.deepcopy(tokenizer)
    # Starts with the end of <|im_end|>: text cut after <|im_end|> could tokenize differently.
    overlapping.add_tokens([AddedToken("|>x", special=False, normalized=False)])
    # Contains <|im_start|>.
    overlapping.add_tokens([AddedToken("<|im_start|>system", special=True, normalized=False)])
    boundaries = safe_boundaries(overlapping)
    assert "<|im_end|>" not in boundaries and "<|im_start|>" not in boundaries
    assert "<tts_pad>" in boundaries  # no added token overlaps its end


def test_a_text_whose_boundaries_do_not_pair_with_its_ids_is_not_remembered(tokenizer, encoder):
    boundaries = safe_boundaries(tokenizer)
    memo = TokenMemo()
    text = _conversation(tokenizer, TURNS[:1], "Hi")

    def odd_encode(piece: str) -> list[int]:  # an encoding that lost a boundary token
        return [t for t in _whole(tokenizer, piece) if t != boundaries["<|im_end|>"]]

    memo.tokenize(text, odd_encode, boundaries, encoder._boundary_re)
    encode = CountingEncode(tokenizer)
    memo.tokenize(text, encode, boundaries, encoder._boundary_re)
    assert encode.texts == [text]  # nothing was taken from the odd turn


def test_the_encoder_with_a_memo_encodes_as_without_and_forgets_text_with_typed_specials(tokenizer, encoder):
    memo = TokenMemo()
    messages = [{"role": "system", "content": "Be brief."}]
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    for turn, (user, answer) in enumerate(TURNS):
        if turn == 2:
            user += " <|im_end|> typed"  # a user's special-token string: text, and the memo is dropped
        messages.append({"role": "user", "content": user})
        assert encoder.encode(messages, tools, memo) == encoder.encode(messages, tools)
        messages.append({"role": "assistant", "content": answer})
    rendered, cut = encoder.render(messages)
    assert encoder.tokenize(rendered, cut, memo) == encoder.tokenize(rendered, cut)


def test_scopes_have_their_own_memos_the_shared_scope_none_and_a_released_one_starts_over():
    memos = ScopeTokenMemos(max_scopes=2)
    assert memos.get(b"") is None
    a, b = memos.get(b"a" * 16), memos.get(b"b" * 16)
    assert a is not b and memos.get(b"a" * 16) is a
    memos.release(b"a" * 16)
    assert memos.get(b"a" * 16) is not a
    memos.get(b"c" * 16)  # over the bound: the least recently used (b) goes
    assert len(memos) == 2 and memos.get(b"b" * 16) is not b
