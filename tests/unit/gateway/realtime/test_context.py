"""A conversation keeps what the thinker's context holds: the thinker's counts of earlier prompts
are kept per item, only what it has not counted is estimated (high), and before a turn that would
not fit the oldest items go, and only those. A connection's turns against a fake thinker (the
fitting before a response, the refit after a refusal) are test_responder.py's."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.config import GatewayConfig
from gateway.realtime.context import (
    AUDIO_WINDOW_TOKENS,
    MESSAGE_TOKENS,
    REPLY_PROMPT_TOKENS,
    ContextFull,
    audio_tokens,
    estimate,
    fit,
    image_tokens,
    measure,
    overflow_of,
    prompt_tokens,
    shape_of,
)
from gateway.realtime.conversation import Conversation, HistoryLimits, Item
from omnistream.request.errors import InvalidRequest, Unavailable
from omnistream.request.media import AudioInput, ImageInput


def user(item_id: str, text: str = "") -> Item:
    return Item(item_id, "user", [{"type": "text", "text": text or item_id}], [])


def answer(item_id: str, text: str, generated: int | None = None) -> Item:
    return Item(item_id, "assistant", [], [{"type": "output_text"}], text=text, generated_tokens=generated)


# -- estimates -----------------------------------------------------------------------------------
def _processor_audio_tokens(samples: int, n_window: int = 50) -> int:
    """What the thinker's processor makes of `samples` of 16 kHz audio: n // 160 mel frames, 13
    tokens per 100 (omnistream/models/qwen3_omni/thinker/thinker_media.py `audio_tokens`), plus
    the two markers."""
    frames = samples // 160
    chunk = n_window * 2
    rest = frames % chunk
    feat = (rest - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * 13 + 2


@pytest.mark.parametrize("seconds", [0.1, 0.5, 0.99, 1.0, 1.01, 2.0, 3.5, 10.0, 59.99, 60.0, 600.0])
def test_the_audio_estimate_is_at_least_what_the_thinker_counts_and_close_to_it(seconds):
    model = _processor_audio_tokens(round(seconds * 16000))
    assert model <= audio_tokens(seconds) <= model + 2 * AUDIO_WINDOW_TOKENS
    # about 13 tokens a second: ten minutes of audio is ~7800 tokens
    assert audio_tokens(600.0) == 7815


def test_text_is_estimated_as_a_token_per_byte_and_an_answer_as_what_was_generated():
    assert estimate(user("u", "héllo")) == MESSAGE_TOKENS + 6
    assert estimate(answer("a", "x" * 400)) == MESSAGE_TOKENS + 400
    assert estimate(answer("a", "x" * 400, generated=90)) == MESSAGE_TOKENS + 92
    assert estimate(answer("a", "", generated=90)) == 0  # no words: not in the prompt
    audio = AudioInput(np.zeros(32000, np.float32))
    image = ImageInput(np.zeros((64, 96, 3), np.uint8))
    item = Item("m", "user", [{"type": "audio", "audio": audio}, {"type": "image", "image": image},
                              {"type": "text", "text": "what?"}], [], audio_seconds=2.0)  # fmt: skip
    assert estimate(item) == MESSAGE_TOKENS + audio_tokens(2.0) + image_tokens(64, 96) + 5
    assert image_tokens(64, 96) == 2 * 3 + 2


# -- measuring -----------------------------------------------------------------------------------
def test_the_thinkers_count_is_kept_per_item_and_only_new_items_are_estimated():
    c = Conversation()
    c.add(user("u1", "x" * 100))
    shape = shape_of(c, "Be brief.")
    assert measure(c, shape, 40)
    assert prompt_tokens(c, "Be brief.") == 40  # exact now
    # the system message and the user item shared the count in proportion to their estimates
    assert c.system_tokens is not None and c.system_tokens[0] == "Be brief."
    assert c.system_tokens[1] + c.items["u1"].tokens + REPLY_PROMPT_TOKENS == 40
    c.add(answer("a1", "y" * 50, generated=12))
    c.add(user("u2", "z" * 20))
    assert prompt_tokens(c, "Be brief.") == 40 + (MESSAGE_TOKENS + 14) + (MESSAGE_TOKENS + 20)
    assert measure(c, shape_of(c, "Be brief."), 40 + 18 + 12)
    # the answer's near-exact estimate is its share; the user item takes the rest
    assert (c.items["a1"].tokens, c.items["u2"].tokens) == (MESSAGE_TOKENS + 14, 30 - MESSAGE_TOKENS - 14)
    assert prompt_tokens(c, "Be brief.") == 70
    assert prompt_tokens(c, "Other instructions.") == 70 - c.system_tokens[1] + MESSAGE_TOKENS + 19


def test_a_delete_or_truncate_under_a_measured_prompt_voids_that_measurement():
    c = Conversation()
    c.add(user("u1"))
    a1 = answer("a1", "spoken words", generated=3)
    c.add(a1)
    c.add(user("u2"))
    shape = shape_of(c, None)
    a1.truncate(0)  # (no audio made: the text stays, but what it says may have changed)
    assert not measure(c, shape, 30)
    assert all(i.tokens is None for i in c.items.values())
    shape = shape_of(c, None)
    c.delete("u1")
    assert not measure(c, shape, 30)
    assert measure(c, shape_of(c, None), 30)
    assert prompt_tokens(c, None) == 30
    c.delete("a1")  # its tokens go with it
    assert prompt_tokens(c, None) == 30 - c_tokens_of(a1)


def c_tokens_of(item: Item) -> int:
    assert item.tokens is not None
    return item.tokens


def test_a_count_that_contradicts_what_is_known_teaches_nothing():
    c = Conversation()
    c.add(user("u1"))
    assert measure(c, shape_of(c, None), 20)
    c.add(user("u2"))
    assert not measure(c, shape_of(c, None), 20)  # u2 would take no token
    assert c.items["u2"].tokens is None


# -- fitting -------------------------------------------------------------------------------------
def _turns(c: Conversation, n: int, tokens: int) -> None:
    """n measured user/answer pairs of `tokens` each."""
    for k in range(n):
        c.add(user(f"u{k}"))
        c.items[f"u{k}"].tokens = tokens
        c.add(answer(f"a{k}", "words", generated=2))
        c.items[f"a{k}"].tokens = tokens


def test_only_what_would_overflow_is_dropped_oldest_first_never_the_newest_user_item():
    c = Conversation()
    _turns(c, 5, 100)  # 1000 tokens
    c.add(user("new"))
    c.items["new"].tokens = 100
    assert fit(c, None, 4096, 256) == []
    # 1100 + 3 + a 256-token answer in 1200: 159 too many -> the two oldest items go
    drops = fit(c, None, 1200, 256)
    assert [d.item.id for d in drops] == ["u0", "a0"] and {d.reason for d in drops} == {"context"}
    # the newest user item alone does not fit: nothing goes, the turn is refused
    with pytest.raises(ContextFull, match="cannot fit the model's context"):
        fit(c, None, 300, 256)
    # what follows the newest user item (a client's own assistant item) and system items stay
    c.add(Item("s", "system", [{"type": "text", "text": "Be brief."}], []))
    c.add(answer("after", "prefilled", generated=3))
    droppable = [i.id for i in c.droppable()]
    assert droppable == [f"{r}{k}" for k in range(5) for r in "ua"]


def test_twenty_turns_fit_the_default_context():
    c = Conversation(HistoryLimits.of(GatewayConfig()))
    for k in range(20):
        c.add(user(f"u{k}", "What time is it, please?"))
        assert fit(c, "Be brief.", 4096, 256) == []
        c.add(answer(f"a{k}", "It is noon, more or less.", generated=8))
    assert len(c.items) == 40


def test_the_stage_message_bound_drops_the_oldest_audio_before_a_turn():
    second = AudioInput(np.zeros(16000, np.float32))  # 64000 bytes
    c = Conversation(HistoryLimits(max_bytes=150_000, max_chars=10**6))
    for k in range(2):
        c.add(Item(f"u{k}", "user", [{"type": "audio", "audio": second}], [], audio_seconds=1.0))
    c.add(user("u2", "and this?"))
    drops = fit(c, "x" * 30_000, 10**6, 256)  # long instructions share the message
    assert [(d.item.id, d.reason) for d in drops] == [("u0", "message_size")]


def test_the_thinkers_refusal_names_the_prompts_length():
    text = InvalidRequest("prompt (4000 tokens) + max_tokens (256) exceeds the model length 4096")
    media = InvalidRequest("the prompt (5000 tokens with its media) exceeds the model length 4096")
    assert overflow_of(text) == (4000, 4096) and overflow_of(media) == (5000, 4096)
    assert overflow_of(InvalidRequest("unknown voice 'x'")) is None
    assert overflow_of(Unavailable("prompt (1 tokens) exceeds the model length 2")) is None
