"""The calls in a streamed answer: words stay text, calls come as name then arguments, a broken
call stays text (auto), and the joined stream is the whole answer however it was split."""

from __future__ import annotations

import itertools
import json

import pytest

from gateway.tools.parser import CallPiece, TextPiece, ToolCallParser

NAMES = ("get_weather", "get_time")
WEATHER = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "when": {"day": 1}}}\n</tool_call>'
)
TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def parse(text: str, enforced: bool, step: int = 1, names=NAMES):
    ids = itertools.count()
    parser = ToolCallParser(names, enforced, new_id=lambda: f"call_{next(ids)}")
    pieces = []
    for i in range(0, len(text), step):
        pieces += parser.feed(text[i : i + step])
    pieces += parser.finish()
    return parser, pieces


def joined(pieces):
    """What a client assembles from the pieces (openai-python's stream accumulation)."""
    text = "".join(p.text for p in pieces if isinstance(p, TextPiece))
    calls: dict[int, dict] = {}
    for p in pieces:
        if isinstance(p, CallPiece):
            if p.id is not None:
                assert p.index not in calls and p.arguments == ""  # id and name come first, once
                calls[p.index] = {"id": p.id, "name": p.name, "arguments": ""}
            else:
                calls[p.index]["arguments"] += p.arguments
    return text, [calls[i] for i in sorted(calls)]


ANSWER = f"Let me look.\n{WEATHER}\n{TIME}"


@pytest.mark.parametrize("enforced", [False, True])
@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_words_and_calls_however_the_text_is_split(enforced, step):
    parser, pieces = parse(ANSWER, enforced, step)
    text, calls = joined(pieces)
    # The blanks around calls are markup; enforced, all that is outside the calls (the grammar
    # allows no words there, so it can be nothing but markup).
    assert text == parser.text == ("" if enforced else "Let me look.")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "when": {"day": 1}}),
        ("get_time", {}),
    ]
    assert [(c.id, c.name, c.arguments) for c in parser.calls] == [
        (c["id"], c["name"], c["arguments"]) for c in calls
    ]
    assert [c["id"] for c in calls] == ["call_0", "call_1"]


def test_enforced_arguments_stream_as_they_come():
    _, pieces = parse(WEATHER, enforced=True, step=1)
    argument_pieces = [p for p in pieces if isinstance(p, CallPiece) and p.id is None]
    assert len(argument_pieces) > 10  # piece by piece, not held to the end
    assert "".join(p.arguments for p in argument_pieces) == '{"city": "Paris", "when": {"day": 1}}'


def test_auto_holds_a_call_until_it_parses():
    parser = ToolCallParser(NAMES)
    assert parser.feed(WEATHER[:-5]) == []
    assert [type(p) for p in parser.feed(WEATHER[-5:])] == [CallPiece, CallPiece]


@pytest.mark.parametrize(
    "text",
    [
        'Hi <tool_call>{"name": "get_weather", "arguments": {"city": </tool_call> there',  # not JSON
        'Hi <tool_call>{"name": "get_news", "arguments": {}}</tool_call> there',  # not offered
        'Hi <tool_call>{"name": "get_time", "arguments": "now"}</tool_call> there',  # not an object
        'Hi <tool_call>{"name": "get_time", "arguments": {}, "x": 1}</tool_call> there',
        'Hi <tool_call>\n{"name": "get_time", "arguments": {}}',  # never closed
        "a < b, <tool_ c <tool_call",
    ],
)
def test_what_does_not_parse_stays_text_in_auto(text):
    for step in (1, 3, len(text)):
        parser, pieces = parse(text, enforced=False, step=step)
        assert joined(pieces) == (text, []) and parser.calls == []


def test_blanks_between_words_stay():
    assert parse("a  b \n", enforced=False)[0].text == "a  b \n"
    assert parse(f"a \n{TIME}\n b", enforced=False)[0].text == "ab"


def test_an_enforced_call_cut_short_keeps_what_came():
    parser, pieces = parse(WEATHER[:60], enforced=True)
    assert parser.text == "" and parser.calls[0].name == "get_weather"
    assert joined(pieces)[1][0]["arguments"] == WEATHER[WEATHER.index("{", 20) : 60]


def test_an_enforced_call_cut_before_its_name_gives_nothing():
    parser, pieces = parse(WEATHER + '\n<tool_call>\n{"name": "get_', enforced=True)
    assert parser.text == "" and [c.name for c in parser.calls] == ["get_weather"]
    assert all(isinstance(p, CallPiece) for p in pieces)


@pytest.mark.parametrize("cut", ["}", "}\n", "}\n</tool_c", ""])
def test_an_enforced_call_cut_in_its_closing_keeps_whole_arguments(cut):
    text = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}' + cut
    parser, _ = parse(text, enforced=True)
    assert parser.calls[0].arguments == '{"zone": "UTC"}'


ENFORCED = f"{WEATHER}\n{TIME}"


@pytest.mark.parametrize("step", [1, 3])
def test_an_enforced_answer_cut_anywhere_has_no_words_and_keeps_what_was_made(step):
    """Issue 59: `required` cut by max_tokens in a call's open marker gave the words "<tool_ca" (and
    they were spoken). Under the grammar everything outside a call is markup: cut anywhere, the
    answer is the calls whose name came, each with a beginning of its arguments."""
    whole = [c.arguments for c in parse(ENFORCED, enforced=True)[0].calls]
    for cut in range(len(ENFORCED) + 1):
        parser, pieces = parse(ENFORCED[:cut], enforced=True, step=step)
        text, calls = joined(pieces)
        assert text == parser.text == "", cut
        named = ENFORCED[:cut].count('"arguments":')  # the calls whose name (and its end) came
        assert [c["name"] for c in calls] == ["get_weather", "get_time"][:named], cut
        for call, made in zip(calls, whole, strict=False):
            assert made.startswith(call["arguments"]), (cut, call["arguments"])


@pytest.mark.parametrize("cut", ["<", "<tool_ca", "<tool_call", "<tool_call>", '<tool_call>\n{"na'])
def test_an_enforced_answer_cut_in_its_first_call_before_the_name_is_nothing(cut):
    parser, pieces = parse(cut, enforced=True)
    assert pieces == [] and parser.text == "" and parser.calls == []
    # auto reads the same text as words: no grammar said it was markup
    assert parse(cut, enforced=False)[0].text == cut


def test_enforced_text_outside_calls_is_never_words():
    parser, pieces = parse(f"x\n{TIME}\ny", enforced=True, step=100)
    assert parser.text == "" and all(isinstance(p, CallPiece) for p in pieces)
    assert [(c.name, c.arguments) for c in parser.calls] == [("get_time", "{}")]
