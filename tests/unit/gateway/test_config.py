"""Caps the operator may set: the realtime history settings (by default a conversation keeps what
the thinker's context holds: no item, audio or token cap) and admission's (by default derived from
the stages); a cap that is set must be a real bound."""

from __future__ import annotations

import pytest

from gateway.config import GatewayConfig

STAGES = {"thinker": ["a:1"]}


def test_a_conversation_has_no_history_cap_by_default():
    config = GatewayConfig(**STAGES)
    config.validate()
    assert config.realtime_context_tokens is None  # the thinker's max_model_len
    assert config.realtime_max_history_items is None
    assert config.realtime_history_audio_seconds is None


def test_admission_is_derived_from_the_stages_by_default_and_caps_may_be_set():
    config = GatewayConfig(**STAGES)
    assert (config.max_concurrency, config.max_queue, config.audio_hold_queue) == (None, None, None)
    GatewayConfig(**STAGES, max_concurrency=1, max_queue=0, audio_hold_queue=0).validate()


def test_history_caps_may_be_set():
    GatewayConfig(
        **STAGES,
        realtime_context_tokens=8192,
        realtime_max_history_items=1,
        realtime_history_audio_seconds=0.5,
    ).validate()


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("realtime_context_tokens", 0, "realtime_context_tokens must be at least 1"),
        ("realtime_max_history_items", 0, "realtime_max_history_items must be at least 1"),
        ("realtime_history_audio_seconds", 0.0, "realtime_history_audio_seconds must be positive"),
        ("realtime_history_audio_seconds", -5.0, "realtime_history_audio_seconds must be positive"),
        ("max_concurrency", 0, "max_concurrency must be at least 1"),
        ("max_queue", -1, "max_queue must be at least 0"),
        ("audio_hold_queue", -1, "audio_hold_queue must be at least 0"),
    ],
)
def test_a_cap_that_bounds_nothing_is_refused(setting, value, message):
    with pytest.raises(ValueError, match=message):
        GatewayConfig(**STAGES, **{setting: value}).validate()
