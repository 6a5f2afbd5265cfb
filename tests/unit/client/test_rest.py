import base64
import json

import numpy as np
import pytest

from omnistream.client import AudioChunk, End, InvalidRequest, TextDelta, TooLarge, Usage
from omnistream.client.rest import _error, _Parser, build_body


def test_body_is_a_streamed_chat_completion_with_pcm16_audio():
    body = build_body("hi", seed=3, voice="chelsie", max_tokens=5, talker_temperature=0.0)
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["stream"] is True
    assert body["audio"] == {"format": "pcm16", "voice": "chelsie"} and body["modalities"] == [
        "text",
        "audio",
    ]
    assert body["seed"] == 3 and body["max_tokens"] == 5 and body["talker_temperature"] == 0.0
    assert build_body("hi", audio=False)["modalities"] == ["text"]


def test_false_is_sent_and_none_is_not():
    """`async_chunk=False` (sequential mode, against the default on) reaches the gateway."""
    body = build_body("hi", async_chunk=False, ignore_eos=None)
    assert body["async_chunk"] is False and "ignore_eos" not in body


def test_media_parts_become_openai_parts():
    part = {"type": "audio", "data": b"abc", "mime_type": "audio/mpeg"}
    image = {"type": "image", "data": b"png", "mime_type": "image/png"}
    body = build_body([{"role": "user", "content": [part, image, {"type": "text", "text": "?"}]}])
    audio, img, text = body["messages"][0]["content"]
    assert audio == {"type": "input_audio", "input_audio": {"data": "YWJj", "format": "mp3"}}
    assert img["image_url"]["url"] == "data:image/png;base64,cG5n" and text["text"] == "?"


def test_fields_rest_does_not_have_are_refused():
    with pytest.raises(ValueError, match="top_k"):
        build_body("hi", top_k=5)


def _line(delta=None, finish=None, usage=None) -> str:
    body = {"choices": [{"delta": delta or {}, "finish_reason": finish}]}
    if usage:
        body["usage"] = usage
    return "data: " + json.dumps(body)


def test_sse_lines_become_the_same_events_as_grpc():
    parser = _Parser(24000)
    pcm = np.array([100, -200], "<i2")
    events = []
    for line in (
        _line({"content": "he"}),
        _line({"audio": {"data": base64.b64encode(pcm.tobytes()).decode()}}),
        _line({"audio": {"data": base64.b64encode(pcm.tobytes()).decode()}}),
        _line({}, finish="stop", usage={"prompt_tokens": 2, "completion_tokens": 1}),
        "data: [DONE]",
    ):
        events += parser.events(line)
    assert events[0] == TextDelta("he")
    assert isinstance(events[1], AudioChunk) and events[2].first_sample == 2
    np.testing.assert_allclose(events[1].samples, pcm / 32767.0)
    assert events[3:] == [Usage(2, 1), End("stop")]


def test_openai_audio_deltas_give_the_transcript_as_text_once():
    """With audio the text comes as `delta.audio.transcript` (content null); with the
    transcript_in_content extension in both fields, still one TextDelta."""
    parser = _Parser(24000)
    pcm = np.array([7], "<i2")
    events = []
    for line in (
        _line({"role": "assistant", "content": None, "refusal": None}),
        _line({"content": None, "audio": {"id": "audio-1", "transcript": "he"}}),
        _line({"audio": {"transcript": "llo"}}),
        _line({"content": "!", "audio": {"transcript": "!"}}),
        _line({"audio": {"data": base64.b64encode(pcm.tobytes()).decode()}}),
        _line({"audio": {"expires_at": 123}}),
        _line({}, finish="stop"),
    ):
        events += parser.events(line)
    assert events[:3] == [TextDelta("he"), TextDelta("llo"), TextDelta("!")]
    assert isinstance(events[3], AudioChunk) and events[3].samples.size == 1
    assert events[4:] == [End("stop")]


def test_error_bodies_become_typed_errors():
    body = json.dumps({"error": {"message": "too big", "code": "request_too_large", "param": "messages"}})
    error = _error(413, body, {})
    assert isinstance(error, TooLarge) and error.field == "messages" and error.http_status == 413
    with pytest.raises(InvalidRequest):
        _Parser(24000).events("data: " + json.dumps({"error": {"code": "invalid_request", "message": "x"}}))
