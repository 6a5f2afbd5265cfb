"""The conversations' turns as a client reads them (omnistream/bench/conversation/workloads.py)."""

from __future__ import annotations

import base64

import pytest

from omnistream.bench.conversation.workloads import (
    SENTENCES,
    Turn,
    realtime_turn_from_events,
    turn_from_result,
    user_text,
)
from omnistream.bench.speech import until
from omnistream.bench.stats import RequestResult


def test_a_turn_knows_its_cached_share_and_says_none_without_usage():
    assert Turn(1, input_tokens=200, cached_tokens=150).cached_share == 0.75
    assert Turn(1).cached_share is None
    assert Turn(1, input_tokens=0, cached_tokens=0).cached_share is None
    assert Turn(2, input_tokens=10, cached_tokens=5).as_dict()["cached_share"] == 0.5


def test_a_rest_turn_is_read_from_the_clients_record():
    result = RequestResult(ok=True, start=10.0, end=10.5, tokens=16, prompt_tokens=120, cached_tokens=96)
    result.token_times = [10.02, 10.1]
    result.add_audio(10.05, 24_000, 24_000)
    turn = turn_from_result(3, result)
    assert turn.turn == 3 and turn.ttft_ms == pytest.approx(20.0) and turn.ttfp_ms == pytest.approx(50.0)
    assert turn.e2e_ms == pytest.approx(500.0) and turn.audio_seconds == 1.0
    assert (turn.input_tokens, turn.cached_tokens, turn.cached_share, turn.error) == (120, 96, 0.8, "")
    assert turn_from_result(1, RequestResult(error="HTTP 429")).error == "HTTP 429"
    assert turn_from_result(1, RequestResult()).error == "failed"


def test_a_realtime_turn_is_read_from_its_events():
    audio = base64.b64encode(bytes(2 * 2400)).decode()  # 2400 samples at 24 kHz: 0.1 s
    events = [
        (0.005, {"type": "response.created"}),
        (0.010, {"type": "response.output_audio_transcript.delta", "delta": ""}),  # empty: not text yet
        (0.020, {"type": "response.output_audio_transcript.delta", "delta": "hi"}),
        (0.050, {"type": "response.output_audio.delta", "delta": audio}),
        (0.070, {"type": "response.output_audio.delta", "delta": audio}),
        (
            0.300,
            {
                "type": "response.done",
                "response": {
                    "status": "incomplete",  # what a max_output_tokens answer is called
                    "status_details": {"type": "incomplete", "reason": "max_output_tokens"},
                    "usage": {"input_tokens": 300, "output_tokens": 16,
                              "input_token_details": {"cached_tokens": 270}},
                    "omnistream": {"ttft_ms": 12.5, "tokens_at_first_text": 2},
                },
            },
        ),
    ]  # fmt: skip
    turn = realtime_turn_from_events(4, 0.0, events, 24_000)
    assert turn.ttft_ms == pytest.approx(20.0) and turn.ttfp_ms == pytest.approx(50.0)
    assert turn.e2e_ms == pytest.approx(300.0) and turn.audio_seconds == pytest.approx(0.2)
    assert (turn.input_tokens, turn.cached_tokens, turn.output_tokens) == (300, 270, 16)
    assert turn.cached_share == 0.9 and turn.error == "" and turn.gateway_ttft_ms == 12.5
    assert turn.tokens_at_first_text == 2
    failed = [(0.1, {"type": "response.done", "response": {"status": "failed", "status_details": None}})]
    assert "failed" in realtime_turn_from_events(1, 0.0, failed, 24_000).error


def test_the_turns_are_the_sentences_in_order_and_rotate_for_another_conversation():
    assert user_text(1) == SENTENCES[0] and user_text(20) == SENTENCES[19] and user_text(21) == SENTENCES[0]
    assert user_text(1, offset=3) == SENTENCES[3]
    assert len(set(SENTENCES)) == len(SENTENCES) == 20


def test_a_spoken_turn_ends_in_silence_up_to_its_length_and_a_longer_one_is_whole():
    speech = b"\x01\x02" * 24_000  # 1 s of pcm16 at 24 kHz
    padded = until(speech, 2.5)
    assert len(padded) == 2 * 60_000 and padded[: len(speech)] == speech and not any(padded[len(speech) :])
    assert until(speech, 0.5) == speech and until(speech, 0.0) == speech
