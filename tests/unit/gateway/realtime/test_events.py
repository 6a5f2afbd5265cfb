"""Client event parsing: both schemes, strict types, errors that name the event and the field."""

from __future__ import annotations

import json

import pytest

from gateway.realtime import events as ev
from gateway.realtime.events import EventError, parse
from gateway.realtime.protocol import Protocol
from gateway.realtime.session_config import SessionConfig
from gateway.realtime.settings import TurnDetection


def event(**fields) -> str:
    return json.dumps(fields)


def test_every_client_event_type_parses():
    cases = {
        "session.update": {"session": {"type": "realtime"}},
        "input_audio_buffer.append": {"audio": "AAAA"},
        "input_audio_buffer.commit": {},
        "input_audio_buffer.clear": {},
        "conversation.item.create": {
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        },
        "conversation.item.truncate": {"item_id": "i", "content_index": 0, "audio_end_ms": 10},
        "conversation.item.delete": {"item_id": "i"},
        "conversation.item.retrieve": {"item_id": "i"},
        "response.create": {"response": {"output_modalities": ["text"]}},
        "response.cancel": {},
    }
    assert set(cases) == set(ev.EVENT_TYPES)
    for kind, fields in cases.items():
        assert parse(event(type=kind, event_id="x", **fields)).type == kind


@pytest.mark.parametrize(
    ("text", "code", "param"),
    [
        ("{", "invalid_json", None),
        ("[]", "invalid_event", None),
        ('{"event_id": "a"}', "invalid_event", "type"),
        ('{"type": "nope", "event_id": "a"}', "unknown_event", "type"),
        ('{"type": "input_audio_buffer.append", "event_id": "a"}', "invalid_value", "audio"),
        ('{"type": "input_audio_buffer.append", "event_id": "a", "audio": 5}', "invalid_value", "audio"),
        ('{"type": "input_audio_buffer.commit", "event_id": "a", "extra": 1}', "invalid_value", "extra"),
        (
            '{"type": "session.update", "event_id": "a", "session": "not an object"}',
            "invalid_value",
            "session",
        ),
        (
            '{"type": "conversation.item.truncate", "event_id": "a", "item_id": "i", "content_index": 0, '
            '"audio_end_ms": -1}',
            "invalid_value",
            "audio_end_ms",
        ),
        (
            '{"type": "response.create", "event_id": "a", "response": {"max_output_tokens": 0}}',
            "invalid_value",
            "response.max_output_tokens",
        ),
    ],
)
def test_bad_events_are_errors_naming_the_field(text, code, param):
    with pytest.raises(EventError) as caught:
        parse(text)
    assert caught.value.code == code
    assert caught.value.param == param
    if "event_id" in text:
        assert caught.value.event_id == "a"


def test_ga_and_beta_session_fields_configure_the_same_things():
    ga = SessionConfig()
    ga.apply(
        parse(
            event(
                type="session.update",
                session={
                    "type": "realtime",
                    "output_modalities": ["text"],
                    "instructions": "be brief",
                    "audio": {
                        "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}},
                        "output": {"voice": "ethan"},
                    },
                    "max_output_tokens": 9,
                },
            )
        ).session
    )
    beta = SessionConfig()
    beta.apply(
        parse(
            event(
                type="session.update",
                session={
                    "modalities": ["text"],
                    "instructions": "be brief",
                    "voice": "ethan",
                    "turn_detection": {"type": "server_vad", "silence_duration_ms": 300},
                    "max_response_output_tokens": 9,
                },
            )
        ).session
    )
    assert ga == beta
    assert ga.turn_detection is not None and ga.turn_detection.silence_duration_ms == 300
    assert not ga.speaks


def test_turn_detection_null_turns_vad_off_and_absent_keeps_it():
    config = SessionConfig()
    config.apply(parse(event(type="session.update", session={"instructions": "x"})).session)
    assert config.turn_detection is not None
    config.apply(
        parse(event(type="session.update", session={"audio": {"input": {"turn_detection": None}}})).session
    )
    assert config.turn_detection is None


def update(**session) -> ev.SessionUpdate:
    parsed = parse(event(type="session.update", event_id="u", session=session))
    assert isinstance(parsed, ev.SessionUpdate)
    return parsed


def test_a_bad_setting_is_refused_alone_and_the_rest_of_the_update_stays():
    """Issue 58: one bad field used to drop the whole update (an agent's instructions and tools)."""
    parsed = update(
        instructions="Be kind.",
        input_audio_format="opus",
        max_output_tokens=0,
        tool_choice={"type": "mcp", "server_label": "x"},
        audio={
            "input": {
                "format": {"type": "audio/pcm", "rate": 16000},
                "turn_detection": {"type": "server_vad", "threshold": 7},
            },
            "output": {"voice": "ash"},
        },
        tools=[{"type": "function", "name": "f"}],
    )
    assert sorted(e.param for e in parsed.refused) == [
        "session.audio.input.format.rate",
        "session.audio.input.turn_detection.threshold",
        "session.input_audio_format",
        "session.max_output_tokens",
        "session.tool_choice.type",
    ]
    assert all(e.code == "invalid_value" and "refused alone" in e.message for e in parsed.refused)
    fields = parsed.session
    assert fields.instructions == "Be kind." and fields.tools is not None and fields.tools[0].name == "f"
    assert fields.audio is not None and fields.audio.output is not None and fields.audio.output.voice == "ash"
    assert fields.audio.input is not None and fields.audio.input.format is None
    assert fields.turn_detection_given() == (False, None)  # refused: the session keeps its own
    assert (fields.max_output_tokens, fields.tool_choice, fields.input_audio_format) == (None, None, None)


def test_what_openai_schemas_accept_is_parsed():
    """The Agents SDK's first session.update (0.24, as it sends it), pipecat's (tool_choice before
    its tools), beta's turn detection without a type, a voice object, a tool without a type, a
    beta tool_choice naming a function: nothing refused."""
    agents = update(
        type="realtime",
        audio={
            "input": {
                "format": {"rate": 24000, "type": "audio/pcm"},
                "transcription": {"model": "gpt-4o-mini-transcribe"},
                "turn_detection": {"type": "semantic_vad", "interrupt_response": True},
            },
            "output": {"format": {"rate": 24000, "type": "audio/pcm"}, "voice": "ash"},
        },
        instructions="Be kind.",
        model="gpt-realtime-2.1",
        output_modalities=["audio"],
        tools=[],
    )
    assert agents.refused == []
    given, detection = agents.session.turn_detection_given()
    assert given and detection is not None and detection.type == "semantic_vad"
    assert detection.eagerness == "auto" and detection.interrupt_response
    pipecat = update(tool_choice="required", turn_detection={"type": "semantic_vad", "eagerness": "low"})
    assert pipecat.refused == [] and pipecat.session.tool_choice == "required"
    beta = update(turn_detection={"silence_duration_ms": 300}, tool_choice="get_weather")
    assert beta.refused == [] and beta.session.turn_detection is not None
    assert beta.session.turn_detection.type == "server_vad"
    ga = update(audio={"output": {"voice": {"id": "chelsie"}}}, tools=[{"name": "f"}])
    assert ga.refused == [] and ga.session.tools is not None and ga.session.tools[0].type == "function"
    for eagerness in ("low", "medium", "high", "auto"):
        assert update(turn_detection={"type": "semantic_vad", "eagerness": eagerness}).refused == []


def test_semantic_vad_is_served_by_the_server_vad_with_its_eagerness_window():
    semantic = TurnDetection(type="semantic_vad", eagerness="low", create_response=False)
    served = semantic.served()
    assert (served.type, served.silence_duration_ms, served.create_response) == ("server_vad", 1500, False)
    assert [TurnDetection(type="semantic_vad", eagerness=e).served().silence_duration_ms for e in
            ("high", "medium", "auto")] == [400, 800, 800]  # fmt: skip
    assert semantic.wire() == {
        "type": "semantic_vad",
        "eagerness": "low",
        "create_response": False,
        "interrupt_response": True,
    }
    server = TurnDetection(silence_duration_ms=300)
    assert server.served() is server and server.wire()["silence_duration_ms"] == 300


def test_input_transcription_is_set_in_either_scheme_shown_back_and_turned_off_by_null():
    config = SessionConfig()
    asked = {"model": "gpt-4o-mini-transcribe", "language": "en", "prompt": "omnistream"}
    config.apply(update(audio={"input": {"transcription": asked}}).session)
    assert config.transcription is not None and config.transcription.spoken == "en"
    assert config.transcription.context == "omnistream"
    ga = config.describe(Protocol(False), "s", "m", "ash", "chelsie")
    assert ga["audio"]["input"]["transcription"] == asked
    config.apply(update(input_audio_transcription=None).session)  # beta: null turns it off
    assert config.transcription is None
    config.apply(update(input_audio_transcription={"model": "whisper-1", "keywords": ["Qwen"]}).session)
    beta = config.describe(Protocol(True), "s", "m", "ash", "chelsie")
    assert beta["input_audio_transcription"] == {"model": "whisper-1"}  # beta's schema has no keywords
    assert config.transcription is not None and config.transcription.context == "Keywords: Qwen."
    config.apply(update(instructions="x").session)  # not named: kept
    assert config.transcription is not None


def test_a_transcription_language_that_is_no_iso_code_is_refused_alone():
    parsed = update(instructions="Be kind.", audio={"input": {"transcription": {"language": "English"}}})
    assert [e.param for e in parsed.refused] == ["session.audio.input.transcription.language"]
    assert parsed.session.instructions == "Be kind."
    assert parsed.session.transcription_given() == (False, None)
