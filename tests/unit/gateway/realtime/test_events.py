"""Client event parsing: both schemes, strict types, errors that name the event and the field."""

from __future__ import annotations

import json

import pytest

from gateway.realtime import events as ev
from gateway.realtime.events import EventError, parse
from gateway.realtime.session import SessionConfig


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
            '{"type": "session.update", "event_id": "a", '
            '"session": {"turn_detection": {"type": "semantic_vad"}}}',
            "invalid_value",
            "session.turn_detection.type",
        ),
        (
            '{"type": "session.update", "event_id": "a", "session": {"input_audio_format": "g711_ulaw"}}',
            "invalid_value",
            "session.input_audio_format",
        ),
        (
            '{"type": "session.update", "event_id": "a", '
            '"session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}}',
            "invalid_value",
            "session.audio.input.format.rate",
        ),
        (
            '{"type": "conversation.item.truncate", "event_id": "a", "item_id": "i", "content_index": 0, '
            '"audio_end_ms": -1}',
            "invalid_value",
            "audio_end_ms",
        ),
        (
            '{"type": "session.update", "event_id": "a", "session": {"max_output_tokens": 0}}',
            "invalid_value",
            "session.max_output_tokens",
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
