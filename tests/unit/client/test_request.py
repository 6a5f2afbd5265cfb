import pytest

from omnistream.client import build_request, media
from omnistream.proto.omni.v1 import stage_pb2
from omnistream.request.defaults import DEFAULTS


def test_a_string_is_one_user_turn_and_nothing_else_is_set():
    request = build_request("hi")
    assert [(m.role, m.content) for m in request.messages] == [("user", "hi")]
    assert not request.HasField("sampling") and not request.HasField("talker_sampling")
    assert not request.text_only and request.max_tokens == 0


def test_a_seed_alone_keeps_the_tables_sampling_for_text_and_voice():
    request = build_request("hi", seed=5)
    s, t = request.sampling, request.talker_sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed) == (DEFAULTS.temperature, DEFAULTS.top_p, 0, 5)
    assert abs(t.temperature - DEFAULTS.talker_temperature) < 1e-6 and t.top_k == DEFAULTS.talker_top_k
    assert abs(t.repetition_penalty - DEFAULTS.talker_repetition_penalty) < 1e-6 and t.seed == 5


def test_a_talker_seed_overrides_the_requests_and_greedy_is_explicit():
    request = build_request("hi", seed=5, talker_seed=9, temperature=0)
    assert request.sampling.temperature == 0 and request.sampling.seed == 5
    assert request.talker_sampling.seed == 9


def test_options_map_to_their_fields():
    request = build_request(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        audio=False,
        voice="chelsie",
        max_tokens=7,
        max_audio_frames=9,
        initial_codec_chunk_frames=2,
        codec_chunk_schedule="fixed",
        async_chunk=False,
        timeout=3.5,
        use_audio_in_video=True,
        request_id="r-1",
    )
    assert request.text_only and request.speaker == "chelsie" and request.request_id == "r-1"
    assert (request.max_tokens, request.max_audio_frames, request.initial_codec_chunk_frames) == (7, 9, 2)
    assert request.async_chunk is False and request.timeout_seconds == 3.5 and request.use_audio_in_video
    assert request.codec_chunk_schedule == stage_pb2.CHUNK_SCHEDULE_FIXED


def test_the_chunk_schedule_is_sent_only_when_given_and_must_be_known():
    assert build_request("hi").codec_chunk_schedule == stage_pb2.CHUNK_SCHEDULE_UNSPECIFIED
    assert (
        build_request("hi", codec_chunk_schedule="grow").codec_chunk_schedule
        == stage_pb2.CHUNK_SCHEDULE_GROWING
    )
    with pytest.raises(ValueError, match="codec_chunk_schedule"):
        build_request("hi", codec_chunk_schedule="doubling")


def test_media_parts_travel_encoded_with_their_kind_and_type(tmp_path):
    wav = tmp_path / "voice.wav"
    wav.write_bytes(b"RIFF....WAVE")
    part = media(wav)
    assert part["type"] == "audio" and part["data"] == b"RIFF....WAVE"
    assert part["mime_type"] in ("audio/wav", "audio/x-wav")  # as the platform's mimetypes names it
    request = build_request([{"role": "user", "content": [part, {"type": "text", "text": "what is this?"}]}])
    (message,) = request.messages
    assert message.content == "" and message.parts[0].media.kind == "audio"
    assert message.parts[0].media.data == b"RIFF....WAVE" and message.parts[1].text == "what is this?"
    assert media(b"\x89PNG", kind="image")["type"] == "image"
