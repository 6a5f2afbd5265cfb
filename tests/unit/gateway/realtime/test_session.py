"""A session's config (what a session.update applies, what is refused alone, how it is shown
back), buffer, append rate, history bounds (the stage message, the optional caps) and truncation."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.config import GatewayConfig
from gateway.realtime.conversation import Conversation, HistoryLimits, Item
from gateway.realtime.events import EventError
from gateway.realtime.input_buffer import AppendRate, InputBuffer
from gateway.realtime.protocol import Protocol
from gateway.realtime.session_config import SessionConfig
from gateway.realtime.settings import SessionFields
from omnistream.request.media import AudioInput


def test_input_buffer_is_bounded_and_tracks_stream_positions():
    buffer = InputBuffer(max_bytes=100)
    assert buffer.append(bytes(60))
    assert not buffer.append(bytes(60))  # refused whole, nothing half-added
    assert buffer.end == 30
    buffer.keep_from(20)
    assert (buffer.start, len(buffer.data)) == (20, 20)
    assert buffer.append(bytes(60))
    assert len(buffer.take(40)) == 40 and buffer.start == 40
    buffer.clear()
    assert buffer.start == buffer.end == 60


def test_append_rate_allows_a_burst_then_real_time():
    now = [0.0]
    rate = AppendRate(2.0, clock=lambda: now[0])
    assert rate.take(1.5)
    assert not rate.take(1.0)
    now[0] += 0.5
    assert rate.take(1.0)
    now[0] += 100.0  # a long pause does not bank more than the burst
    assert rate.take(2.0) and not rate.take(0.1)


def user(item_id: str, seconds: float = 0.0) -> Item:
    return Item(item_id, "user", [{"type": "text", "text": item_id}], [], audio_seconds=seconds)


def test_history_has_no_item_or_audio_bound_by_default():
    conversation = Conversation(HistoryLimits.of(GatewayConfig()))
    for n in range(40):
        assert conversation.add(user(f"u{n}", 30.0)) == []  # 40 items, 20 min of audio: all kept
    assert len(conversation.items) == 40


def test_the_optional_caps_drop_the_oldest_items_past_them():
    limits = HistoryLimits(max_bytes=10**9, max_chars=10**9, max_items=3, max_audio_seconds=10.0)
    conversation = Conversation(limits)
    assert conversation.add(user("a", 4.0)) == []
    assert conversation.add(user("b")) == []
    assert conversation.add(user("c", 4.0)) == []
    assert conversation.add(user("d")) == [("a", "max_items")]
    assert conversation.add(user("e", 7.0)) == [("b", "max_items"), ("c", "audio_seconds")]
    assert list(conversation.items) == ["d", "e"]
    with pytest.raises(EventError):
        conversation.add(user("d"))
    with pytest.raises(EventError):
        conversation.get("a")


def test_the_history_always_fits_one_stage_message_to_the_thinker():
    """Every turn re-sends the history's decoded audio in one ThinkerOpen: past what that message
    carries the oldest go, never a system item, the newest user item or what follows it."""
    second = AudioInput(np.zeros(16000, np.float32))  # 64000 bytes on the wire
    conversation = Conversation(HistoryLimits(max_bytes=200_000, max_chars=10**6))
    system = Item("s", "system", [{"type": "text", "text": "Be brief."}], [])
    assert conversation.add(system) == []
    for n in range(3):
        audio = Item(f"u{n}", "user", [{"type": "audio", "audio": second}], [], audio_seconds=1.0)
        assert conversation.add(audio) == []
        assert conversation.add(Item(f"a{n}", "assistant", [], [], text="ok")) == []
    audio = Item("u3", "user", [{"type": "audio", "audio": second}], [], audio_seconds=1.0)
    assert conversation.add(audio) == [("u0", "message_size")]
    assert list(conversation.items) == ["s", "a0", "u1", "a1", "u2", "a2", "u3"]
    assert conversation.totals().bytes <= 200_000
    assert conversation.droppable() == [conversation.items[i] for i in ("a0", "u1", "a1", "u2", "a2")]


def test_truncation_keeps_the_share_of_text_that_was_heard():
    item = Item("x", "assistant", [], [{"type": "output_audio"}], text="0123456789")
    item.audio_samples_made = 24000  # 1 s made
    item.tokens = 9  # as the thinker counted it
    item.truncate(300)
    assert (item.audio_end_ms, item.text) == (300, "012")
    assert item.tokens is None and item.revision == 1  # what it says changed: estimated again


VOICES = ("chelsie", "ethan", "aiden")


def test_openai_voices_are_taken_and_shown_as_asked_with_the_voice_that_speaks():
    config = SessionConfig()
    fields = SessionFields.model_validate({"audio": {"output": {"voice": "ash"}}})
    assert config.apply(fields, VOICES) == []
    assert config.voice == "ash"
    session = config.describe(Protocol(beta=False), "sess_1", "m", "ash", "ethan")
    assert session["audio"]["output"]["voice"] == "ash" and session["omnistream"]["voice"] == "ethan"
    beta = config.describe(Protocol(beta=True), "sess_1", "m", "ash", "ethan")
    assert beta["voice"] == "ash" and "model" not in beta  # beta's schema takes OpenAI's models only


def test_a_voice_the_deployment_cannot_speak_is_refused_alone():
    config = SessionConfig(voice="chelsie")
    fields = SessionFields.model_validate({"voice": "nobody", "instructions": "Be brief."})
    (refused,) = config.apply(fields, VOICES)
    assert refused.param == "session.voice" and "nobody" in refused.message
    assert (config.voice, config.instructions) == ("chelsie", "Be brief.")
    # Before a talker joined (voices unknown) a voice cannot be checked: it is taken.
    assert config.apply(fields, None) == [] and config.voice == "nobody"


def test_semantic_vad_is_shown_as_asked_and_what_serves_it_in_the_extension():
    config = SessionConfig()
    fields = SessionFields.model_validate(
        {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}}
    )
    assert config.apply(fields) == []
    session = config.describe(Protocol(beta=False), "sess_1", "m", "ethan", "ethan")
    assert session["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad",
        "eagerness": "high",
        "create_response": True,
        "interrupt_response": True,
    }
    served = session["omnistream"]["turn_detection"]
    assert served["type"] == "server_vad" and served["silence_duration_ms"] == 400


def test_a_named_choice_is_a_name_in_beta_and_an_object_in_ga():
    config = SessionConfig()
    config.apply(SessionFields.model_validate({"tool_choice": "get_weather"}))  # beta's string
    ga = config.describe(Protocol(beta=False), "s", "m", "ethan", "ethan")
    beta = config.describe(Protocol(beta=True), "s", "m", "ethan", "ethan")
    assert ga["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert beta["tool_choice"] == "get_weather"


def test_the_audio_formats_are_set_apart_in_either_scheme_and_shown_as_asked():
    config = SessionConfig()
    assert config.apply(SessionFields(input_audio_format="g711_ulaw", output_audio_format="g711_alaw")) == []
    beta = config.describe(Protocol(beta=True), "sess_1", "m", "ash", "ethan")
    assert (beta["input_audio_format"], beta["output_audio_format"]) == ("g711_ulaw", "g711_alaw")
    ga_update = {
        "input": {"format": {"type": "audio/pcm", "rate": 24000}},
        "output": {"format": {"type": "audio/pcmu"}},
    }
    assert config.apply(SessionFields.model_validate({"audio": ga_update})) == []
    audio = config.describe(Protocol(beta=False), "sess_1", "m", "ash", "ethan")["audio"]
    assert audio["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert audio["output"]["format"] == {"type": "audio/pcmu"}
    assert config.apply(SessionFields(instructions="x")) == [] and config.output_format.type == "audio/pcmu"
