"""A turn's request: instructions first, the kept history as chat messages, defaults resolved; an
OpenAI voice spoken by the model's voice; a choice that its tools cannot meet refused."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.realtime.conversation import Conversation, Item
from gateway.realtime.events import EventError
from gateway.realtime.session_config import SessionConfig
from gateway.realtime.settings import ResponseFields
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


VOICES = ("chelsie", "ethan", "aiden")


def test_an_openai_voice_is_spoken_by_the_models_voice():
    config = SessionConfig(voice="ash")
    serving = ServingDefaults(voices=VOICES)
    request = build_request(conversation(), config, ResponseSettings.of(config, None), serving)
    assert request.speaker == "ethan"
    fields = ResponseFields.model_validate({"audio": {"output": {"voice": "coral"}}})
    settings = ResponseSettings.of(config, fields, VOICES)
    assert build_request(conversation(), config, settings, serving).speaker == "chelsie"
    with pytest.raises(EventError) as refused:
        ResponseSettings.of(config, ResponseFields(voice="nobody"), VOICES)
    assert refused.value.param == "response.voice"


def test_a_choice_its_tools_cannot_meet_is_refused_naming_where_it_was_set():
    config = SessionConfig(tool_choice="required")
    with pytest.raises(EventError) as session:
        _ = ResponseSettings.of(config, None).tool_use
    assert session.value.param == "session.tool_choice" and "needs tools" in session.value.message
    fields = ResponseFields.model_validate({"tool_choice": {"type": "function", "name": "f"}})
    with pytest.raises(EventError) as response:
        _ = ResponseSettings.of(config, fields).tool_use
    assert response.value.param == "response.tool_choice"
    tools = ResponseFields.model_validate({"tools": [{"type": "function", "name": "f"}]})
    assert ResponseSettings.of(config, tools).tool_use.enforced_calls
