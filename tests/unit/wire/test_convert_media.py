"""Media on the stage wire: GenerationRequest media parts -> ThinkerOpen -> the thinker's messages,
and the thinker's chunk 0 (deep rows, media layout) forwarded to the talker as is."""

from __future__ import annotations

import numpy as np
import pytest

from omnistream.proto.omni.v1 import common_pb2, stage_pb2
from omnistream.request.errors import InvalidRequest
from omnistream.request.generation import GenerationRequest
from omnistream.request.media import MediaLayout
from omnistream.request.stage_chain import stage_opens
from omnistream.wire.convert import (
    media_layout_from_proto,
    media_layout_to_proto,
    talker_input_proto,
    thinker_open_proto,
)
from omnistream.wire.messages import messages_from_proto
from omnistream.wire.tensors import to_proto
from tests.media_samples import conversations


@pytest.mark.parametrize("name", list(conversations()))
def test_media_messages_round_trip_through_thinker_open(name):
    messages, aiv = conversations()[name]
    request = GenerationRequest(messages=messages, use_audio_in_video=aiv, return_audio=False)
    open_ = thinker_open_proto("r", stage_opens(request, None), request.messages, None)
    assert open_.use_audio_in_video == aiv
    wire = stage_pb2.ThinkerOpen.FromString(open_.SerializeToString())
    back = messages_from_proto(wire.messages)
    assert [m["role"] for m in back] == [m["role"] for m in messages]
    for got, sent in zip(back, messages, strict=True):
        if isinstance(sent["content"], str):
            assert got["content"] == sent["content"]
            continue
        for g, s in zip(got["content"], sent["content"], strict=True):
            assert g["type"] == s["type"]
            if s["type"] == "text":
                assert g["text"] == s["text"]
            elif s["type"] == "audio":
                np.testing.assert_array_equal(g["audio"].samples, s["audio"].samples)
                assert g["audio"].sample_rate == s["audio"].sample_rate
            elif s["type"] == "image":
                np.testing.assert_array_equal(g["image"].pixels, s["image"].pixels)
            else:
                np.testing.assert_array_equal(g["video"].frames, s["video"].frames)
                assert g["video"].fps == s["video"].fps
                assert (g["video"].audio is None) == (s["video"].audio is None)


def test_thinker_refuses_encoded_media_and_wrong_dtypes():
    encoded = common_pb2.Message(
        role="user", parts=[common_pb2.ContentPart(media=common_pb2.EncodedMedia(kind="image", data=b"x"))]
    )
    with pytest.raises(InvalidRequest, match="takes text, audio, image or video"):
        messages_from_proto([encoded])
    wrong = common_pb2.Message(
        role="user",
        parts=[
            common_pb2.ContentPart(
                image=common_pb2.ImagePart(pixels=to_proto(np.zeros((2, 2, 3), np.float32)))
            )
        ],
    )
    with pytest.raises(InvalidRequest, match="uint8") as err:
        messages_from_proto([wrong])
    assert err.value.field == "messages[0].parts[0].image.pixels"
    both = common_pb2.Message(role="user", content="hi", parts=[common_pb2.ContentPart(text="x")])
    with pytest.raises(InvalidRequest):
        messages_from_proto([both])


def test_talker_input_forwards_deep_rows_and_layout():
    layout = MediaLayout(((1, 4, 6),), ((2, 4, 4),), (1.0,), (130,))
    chunk = stage_pb2.ThinkerChunk(
        prompt_ids=[1, 2, 3],
        token_ids=[7],
        prompt_hidden=to_proto(np.ones((2, 4), np.float32)),
        multimodal_positions=[1, 2],
        media_layout=media_layout_to_proto(layout),
    )
    msg = talker_input_proto(chunk)
    assert list(msg.multimodal_positions) == [1, 2] and msg.prompt_hidden == chunk.prompt_hidden
    assert media_layout_from_proto(msg.media_layout) == layout
    plain = talker_input_proto(stage_pb2.ThinkerChunk(token_ids=[5], finished=True))
    assert not plain.HasField("prompt_hidden") and not plain.HasField("media_layout") and plain.last


@pytest.mark.parametrize(
    "bad",
    [
        common_pb2.MediaLayout(image_grid_thw=[1, 2]),
        common_pb2.MediaLayout(image_grid_thw=[1, 0, 2]),
        common_pb2.MediaLayout(video_grid_thw=[1, 2, 2]),  # no seconds per grid
        common_pb2.MediaLayout(video_grid_thw=[1, 2, 2], video_second_per_grid=[float("nan")]),
        common_pb2.MediaLayout(audio_feature_lengths=[0]),
    ],
)
def test_malformed_media_layout_is_refused(bad):
    with pytest.raises(InvalidRequest):
        media_layout_from_proto(bad)


def test_audio_a_referrer_names_goes_as_its_digest_and_comes_back_as_a_ref():
    from omnistream.request.media import AudioInput, AudioRef, audio_digest

    known, new = (AudioInput(np.full(480, v, dtype=np.float32)) for v in (0.25, -0.5))
    messages = [{"role": "user", "content": [{"type": "audio", "audio": a}]} for a in (known, new)]
    request = GenerationRequest(messages=messages, return_audio=False, cache_scope=b"s")

    def refer(audio):
        return audio_digest(audio) if audio is known else None

    open_ = thinker_open_proto("r", stage_opens(request, None), messages, None, refer=refer)
    first, second = (m.parts[0].audio for m in open_.messages)
    assert first.digest == audio_digest(known) and not first.HasField("samples")
    assert not second.digest and second.HasField("samples")
    wire = stage_pb2.ThinkerOpen.FromString(open_.SerializeToString())
    back = messages_from_proto(wire.messages)
    assert back[0]["content"][0]["audio"] == AudioRef(audio_digest(known), 16000)
    assert np.array_equal(back[1]["content"][0]["audio"].samples, new.samples)


def test_digests_differ_with_the_samples_and_the_rate():
    from omnistream.request.media import AudioInput, audio_digest

    samples = np.linspace(-1, 1, 160, dtype=np.float32)
    base = audio_digest(AudioInput(samples))
    assert audio_digest(AudioInput(samples.copy())) == base and len(base) == 32
    assert audio_digest(AudioInput(samples, 8000)) != base
    changed = samples.copy()
    changed[-1] = 0.5
    assert audio_digest(AudioInput(changed)) != base


@pytest.mark.parametrize(
    "audio, message",
    [
        (common_pb2.AudioPart(digest=b"x" * 32, samples=to_proto(np.zeros(4, np.float32))), "not both"),
        (common_pb2.AudioPart(digest=b"short"), "a SHA-256 is 32"),
    ],
)
def test_a_bad_digest_part_is_refused(audio, message):
    msg = common_pb2.Message(role="user", parts=[common_pb2.ContentPart(audio=audio)])
    with pytest.raises(InvalidRequest, match=message):
        messages_from_proto([msg])


def test_a_videos_sound_never_travels_as_a_digest():
    video = common_pb2.VideoPart(
        frames=to_proto(np.zeros((1, 2, 2, 3), np.uint8)),
        fps=2.0,
        audio=common_pb2.AudioPart(digest=b"x" * 32),
    )
    msg = common_pb2.Message(role="user", parts=[common_pb2.ContentPart(video=video)])
    with pytest.raises(InvalidRequest, match="video's sound"):
        messages_from_proto([msg])


@pytest.mark.parametrize("name", list(conversations()))
def test_an_open_built_in_its_request_is_the_open_built_alone(name):
    """The gateway builds the open in its request (no copy of the media per nesting level): the same
    message, byte for byte, as one built alone and put in a request."""
    messages, aiv = conversations()[name]
    messages = [*messages, {"role": "assistant", "content": "It is a tone."}]
    request = GenerationRequest(messages=messages, use_audio_in_video=aiv, return_audio=False)
    opens = stage_opens(request, None)
    alone = stage_pb2.ThinkerRequest(open=thinker_open_proto("r", opens, messages, None))
    built = stage_pb2.ThinkerRequest()
    returned = thinker_open_proto("r", opens, messages, None, into=built.open)
    assert returned is built.open
    assert built.SerializeToString(deterministic=True) == alone.SerializeToString(deterministic=True)
    assert len(built.open.messages) == len(messages) and built.open.messages[-1].content == "It is a tone."
