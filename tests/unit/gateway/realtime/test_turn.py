"""A turn's request: instructions first, the kept history as chat messages, defaults resolved."""

from __future__ import annotations

import numpy as np

from gateway.realtime.events import ResponseFields
from gateway.realtime.session import Conversation, Item, SessionConfig
from gateway.realtime.turn import ResponseSettings, build_request, messages_of
from omnistream.request.defaults import ServingDefaults
from omnistream.request.media import AudioInput


def conversation() -> Conversation:
    c = Conversation()
    audio = AudioInput(np.zeros(16000, np.float32))
    c.add(Item("u1", "user", [{"type": "audio", "audio": audio}], [], audio_seconds=1.0))
    c.add(Item("a1", "assistant", [], [], text="It is noon."))
    c.add(Item("s1", "system", [{"type": "text", "text": "Speak French."}], []))
    c.add(Item("a2", "assistant", [], [], text=""))  # interrupted before a word: left out
    c.add(Item("u2", "user", [{"type": "text", "text": "And now?"}], []))
    c.add(Item("a3", "assistant", [], [], status="in_progress", text="partial"))  # the running one
    return c


def test_history_becomes_messages_with_one_system_message_first():
    messages = messages_of(conversation(), "Be brief.")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"] == "Be brief.\n\nSpeak French."
    assert messages[1]["content"][0]["type"] == "audio"
    assert messages[2]["content"] == "It is noon."


def test_response_fields_override_the_session_for_one_response():
    config = SessionConfig(instructions="session", voice="ethan", max_output_tokens=50)
    fields = ResponseFields(instructions="this one", output_modalities=["text"], max_output_tokens=7)
    settings = ResponseSettings.of(config, fields)
    request = build_request(conversation(), config, settings, ServingDefaults())
    assert request.messages[0]["content"].startswith("this one")
    assert not request.return_audio and request.max_tokens == 7
    again = ResponseSettings.of(config, None)
    assert (again.instructions, again.max_output_tokens, again.speaks) == ("session", 50, True)
