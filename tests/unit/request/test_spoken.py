"""The talker speaks the answer's words, never a tool call (omnistream/request/spoken.py)."""

from __future__ import annotations

import itertools
import json

import pytest

from omnistream.request.spoken import CALL_CLOSE, CALL_OPEN, SpokenFilter, TokenPieces, calls_only, spoken_of
from omnistream.request.structured import StructuredOutput

pytestmark = pytest.mark.unit

END = "<|im_end|>"


class PieceTokenizer:
    """A tokenizer over a fixed list of pieces: id i is pieces[i]; specials decode to nothing."""

    def __init__(self, pieces: list[str], specials: tuple[str, ...] = (END,)) -> None:
        self.pieces = pieces
        self.specials = specials

    def ids(self, *pieces: str) -> list[int]:
        return [self.pieces.index(p) for p in pieces]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if text in self.pieces:
            return [self.pieces.index(text)]
        return [self.pieces.index(c) for c in text]  # one character a token

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(
            "" if skip_special_tokens and self.pieces[i] in self.specials else self.pieces[i] for i in ids
        )


WORDS = ["some", " words", " ", "\n", " more", '{"a": 1}', END, ".", "<b>", "{", "}"]
CHARS = sorted(set(CALL_OPEN + CALL_CLOSE))


def streamed(f: SpokenFilter, ids: list[int], split: list[int]) -> list[int]:
    """The filter fed `ids` in chunks cut at `split`, then finished."""
    out: list[int] = []
    cuts = [0, *split, len(ids)]
    for a, b in itertools.pairwise(cuts):
        out += f.push(ids[a:b])
    return out + f.finish()


@pytest.fixture
def whole() -> PieceTokenizer:
    """Markers are single tokens (Qwen3's tokenizer, the tiny one)."""
    return PieceTokenizer([*WORDS, CALL_OPEN, CALL_CLOSE])


@pytest.fixture
def spelled() -> PieceTokenizer:
    """Markers are spelled one character a token (a tokenizer without them, a given answer)."""
    return PieceTokenizer(WORDS + [c for c in CHARS if c not in WORDS])


def spell(tok: PieceTokenizer, *parts: str) -> list[int]:
    """Token ids of `parts`: each its own piece, or (a marker the tokenizer lacks) its characters."""
    out: list[int] = []
    for part in parts:
        out += tok.ids(part) if part in tok.pieces else tok.ids(*part)
    return out


@pytest.mark.parametrize("markers", ["whole", "spelled"])
def test_words_and_a_call_speak_as_the_words_alone(markers: str, request: pytest.FixtureRequest) -> None:
    tok: PieceTokenizer = request.getfixturevalue(markers)
    with_call = spell(tok, "some", " words", " ", CALL_OPEN, "\n", '{"a": 1}', "\n", CALL_CLOSE, END)
    alone = tok.ids("some", " words", END)
    assert spoken_of(tok, with_call) == alone
    # Cut anywhere, the markers split over chunks, the same.
    for cut in range(1, len(with_call)):
        f = TokenPieces(tok).filter()
        assert streamed(f, with_call, [cut]) == alone, cut
    f = TokenPieces(tok).filter()
    assert streamed(f, with_call, list(range(1, len(with_call)))) == alone


@pytest.mark.parametrize("markers", ["whole", "spelled"])
def test_a_call_alone_says_nothing(markers: str, request: pytest.FixtureRequest) -> None:
    tok: PieceTokenizer = request.getfixturevalue(markers)
    ids = spell(tok, "\n", CALL_OPEN, '{"a": 1}', CALL_CLOSE, "\n", END)
    assert spoken_of(tok, ids) == []
    f = TokenPieces(tok).filter()
    assert streamed(f, ids, list(range(1, len(ids)))) == []
    assert f.calls == 1 and not f.spoke


@pytest.mark.parametrize("markers", ["whole", "spelled"])
def test_words_after_calls_are_spoken(markers: str, request: pytest.FixtureRequest) -> None:
    tok: PieceTokenizer = request.getfixturevalue(markers)
    ids = spell(
        tok, "some", " ", CALL_OPEN, "{", CALL_CLOSE, "\n", " more", " ", CALL_OPEN, "}", CALL_CLOSE, ".", END
    )
    # The blanks around both calls go; " more" and "." stay (as "some more." would be spoken).
    assert spoken_of(tok, ids) == tok.ids("some", " more", ".", END)
    f = TokenPieces(tok).filter()
    assert streamed(f, ids, [2, 3, 7]) == tok.ids("some", " more", ".", END)
    assert f.calls == 2


def test_an_answer_without_a_call_is_spoken_whole(spelled: PieceTokenizer) -> None:
    # "<" and "<b>" may start a marker: held, then released in order when they do not.
    ids = spelled.ids("\n", "some", "<", " ", "<b>", "\n", "<", "t", END)
    assert spoken_of(spelled, ids) == ids
    f = TokenPieces(spelled).filter()
    held = f.push(ids[:3])
    assert held == ids[:2]  # "<" waits for what follows
    assert held + f.push(ids[3:]) + f.finish() == ids


def test_blanks_wait_for_the_next_word(whole: PieceTokenizer) -> None:
    f = TokenPieces(whole).filter()
    assert f.push(whole.ids("some", " ")) == whole.ids("some")
    assert f.push(whole.ids(" words")) == whole.ids(" ", " words")


def test_a_call_cut_short_speaks_the_words_before_it(whole: PieceTokenizer) -> None:
    ids = whole.ids("some", " words", " ", CALL_OPEN, '{"a": 1}')  # max_tokens inside the call
    assert spoken_of(whole, ids) == whole.ids("some", " words")


def test_a_single_token_marker_is_found_by_its_id() -> None:
    """A marker the tokenizer decodes to nothing (a special token) is still a marker."""
    tok = PieceTokenizer([*WORDS, CALL_OPEN, CALL_CLOSE], specials=(END, CALL_OPEN, CALL_CLOSE))
    pieces = TokenPieces(tok)
    assert pieces.marker_ids == {CALL_OPEN: len(WORDS), CALL_CLOSE: len(WORDS) + 1}
    ids = tok.ids("some", CALL_OPEN, '{"a": 1}', CALL_CLOSE, END)
    f = pieces.filter()
    assert f.push(ids) + f.finish() == tok.ids("some", END)


@pytest.mark.parametrize("kind", ["json_schema", "json_object"])
def test_a_json_answer_is_never_spoken(whole: PieceTokenizer, kind: str) -> None:
    ids = whole.ids('{"a": 1}', END)
    assert spoken_of(whole, ids, StructuredOutput(kind, "{}" if kind == "json_schema" else "")) == []


def test_a_tool_grammar_answer_speaks_its_words(whole: PieceTokenizer) -> None:
    ids = whole.ids("some", CALL_OPEN, '{"a": 1}', CALL_CLOSE, END)
    assert spoken_of(whole, ids, StructuredOutput("structural_tag", "{}")) == whole.ids("some", END)


def _tag(begin: str = CALL_OPEN + '\n{"name": "f", "arguments": ') -> dict:
    return {"type": "tag", "begin": begin, "content": {"type": "json_schema", "json_schema": {}}, "end": "}"}


def _structural(form: dict) -> StructuredOutput:
    return StructuredOutput("structural_tag", json.dumps({"type": "structural_tag", "format": form}))


# The grammars gateway/tools/spec.py makes for `required` (one call or several) and a named function.
ONLY_CALLS = {
    "named": _structural(_tag()),
    "required": _structural(
        {"type": "tags_with_separator", "tags": [_tag(), _tag()], "separator": "\n", "at_least_one": True}
    ),
}
# Grammars with free text around the calls (a gRPC client's own): xgrammar's triggered tags, its
# older `structures` form, or tags that are not calls.
WITH_WORDS = {
    "triggered": _structural({"type": "triggered_tags", "triggers": [CALL_OPEN], "tags": [_tag()]}),
    "structures": StructuredOutput(
        "structural_tag",
        json.dumps(
            {"structures": [{"begin": CALL_OPEN, "schema": {}, "end": CALL_CLOSE}], "triggers": [CALL_OPEN]}
        ),
    ),
    "other tags": _structural(_tag("<speak>")),
    "word separator": _structural({"type": "tags_with_separator", "tags": [_tag()], "separator": " and "}),
    "not JSON": StructuredOutput("structural_tag", "{"),
}


def test_which_grammars_allow_calls_alone() -> None:
    assert all(calls_only(s) for s in ONLY_CALLS.values())
    assert not any(calls_only(s) for s in WITH_WORDS.values())
    assert not calls_only(None) and not calls_only(StructuredOutput("json_schema", "{}"))


@pytest.mark.parametrize("grammar", sorted(ONLY_CALLS))
@pytest.mark.parametrize("markers", ["whole", "spelled"])
def test_an_answer_of_calls_alone_says_nothing_wherever_it_is_cut(
    grammar: str, markers: str, request: pytest.FixtureRequest
) -> None:
    """Issue 59: `required` cut by max_tokens in a call's open marker (spelled "<tool_ca") spoke it.
    Under a grammar that allows calls alone, nothing is words: cut anywhere, nothing is spoken."""
    tok: PieceTokenizer = request.getfixturevalue(markers)
    ids = spell(tok, CALL_OPEN, "{", CALL_CLOSE, "\n", CALL_OPEN, '{"a": 1}', CALL_CLOSE, END)
    for cut in range(len(ids) + 1):
        f = TokenPieces(tok).filter(ONLY_CALLS[grammar])
        assert streamed(f, ids[:cut], []) == [], cut


def test_a_free_text_grammar_speaks_a_marker_cut_short_as_the_text_it_is(spelled: PieceTokenizer) -> None:
    """With words allowed, an open marker never completed is text (the gateway's parser shows it
    as such), so it is spoken like an answer without a grammar; the words around a call are."""
    cut = spell(spelled, "some", " ", "<tool_ca")
    call = spell(spelled, "some", " ", CALL_OPEN, "{", CALL_CLOSE, END)
    for grammar in WITH_WORDS.values():
        assert spoken_of(spelled, cut, grammar) == spoken_of(spelled, cut) == cut
        assert spoken_of(spelled, call, grammar) == spelled.ids("some", END)


def test_the_tiny_tokenizers_tool_tokens_are_found_by_id(tiny_model_dir):
    """Qwen3's tool tokens are single tokens of the tiny vocabulary, as of the real one."""
    from omnistream.models.qwen3_omni.checkpoint import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    pieces = TokenPieces(tokenizer)
    assert set(pieces.marker_ids) == {CALL_OPEN, CALL_CLOSE}
    words = tokenizer.encode("Hi there.", add_special_tokens=False)
    ids = tokenizer.encode(f"Hi there. {CALL_OPEN}\n{{}}\n{CALL_CLOSE}", add_special_tokens=False)
    assert pieces.marker_ids[CALL_OPEN] in ids
    assert spoken_of(tokenizer, ids) == words
