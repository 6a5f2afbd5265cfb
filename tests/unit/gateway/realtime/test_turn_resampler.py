"""A turn resampled as it arrives is the media decoder's decode of the same turn, sample for sample,
whatever the turn's end, the appends' sizes, the audio after the end, or where the stream began."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.media.file_decode import Deadline, decode_audio
from gateway.media.limits import MediaLimits, Tally
from gateway.realtime.audio import wav_of
from gateway.realtime.turn_resampler import MARGIN, STREAM_EVERY, TurnResampler, resample_whole
from tests.speech import speech_pcm16

SPEECH = np.frombuffer(
    speech_pcm16("Hello there, how are you doing today?") + speech_pcm16("The weather is fine."), "<i2"
)


def media_decoded(pcm: bytes) -> np.ndarray:
    """What a committed turn was before: its WAV through the media decoder."""
    return decode_audio(wav_of(pcm), "audio/wav", "f", Tally(MediaLimits()), Deadline(60)).samples


def streamed(samples: np.ndarray, fed: int, rng: np.random.Generator, start: int = 0) -> TurnResampler:
    """A TurnResampler that followed a buffer (from stream sample `start`) growing by appends of
    random sizes until it held `fed` samples."""
    turn = TurnResampler()
    held = 0
    while held < fed:
        held = min(fed, held + int(rng.integers(1, 2400)))
        turn.advance(start, samples[:held].tobytes())
    return turn


def assert_same(got: np.ndarray | None, want: np.ndarray) -> None:
    assert got is not None
    assert got.dtype == want.dtype == np.float32
    assert got.shape == want.shape
    assert np.array_equal(got, want), np.flatnonzero(got != want)[:5]


@pytest.mark.parametrize("seed", range(4))
def test_a_turn_is_the_media_decoders_decode_at_every_end(seed):
    """Ends anywhere (at and off the resampler's phase), with audio after the end already streamed
    (a server VAD's silence) or not (a client's commit right after its last append)."""
    rng = np.random.default_rng(seed)
    for _ in range(12):
        end = int(rng.integers(1, SPEECH.size))
        fed = min(SPEECH.size, end + int(rng.integers(0, 12000))) if rng.random() < 0.7 else end
        turn = streamed(SPEECH, fed, rng)
        pcm = SPEECH[:end].tobytes()
        assert_same(turn.turn(0, pcm), media_decoded(pcm))


def test_loud_audio_clips_as_the_media_decoder_clips():
    rng = np.random.default_rng(7)
    loud = np.clip(SPEECH.astype(np.int32) * 8, -32768, 32767).astype("<i2")
    for end in (MARGIN + 1, 30001, loud.size):
        pcm = loud[:end].tobytes()
        assert_same(streamed(loud, loud.size, rng).turn(0, pcm), media_decoded(pcm))


def test_short_turns_and_a_moved_start_are_resampled_whole():
    """A turn shorter than the margin is the whole decode too; a buffer whose start moved since it
    was streamed (a server VAD's buffer slides before speech) is left to the whole decode."""
    rng = np.random.default_rng(3)
    for end in (100, MARGIN - 1, MARGIN, MARGIN + 2):
        pcm = SPEECH[:end].tobytes()
        assert_same(streamed(SPEECH, end, rng).turn(0, pcm), media_decoded(pcm))
    turn = streamed(SPEECH, 40000, rng, start=100)
    pcm = SPEECH[:30000].tobytes()
    assert turn.turn(0, pcm) is None  # the caller resamples it whole
    assert_same(resample_whole(pcm), media_decoded(pcm))


def test_a_stream_follows_its_buffers_new_start():
    """After a commit the buffer starts at its end: the stream starts there anew, and the next
    turn is again exact."""
    rng = np.random.default_rng(5)
    turn = streamed(SPEECH, 50000, rng)
    later = SPEECH[50000:]
    held = 0
    while held < later.size:
        held = min(later.size, held + 480)
        turn.advance(50000, later[:held].tobytes())
    assert turn.origin == 50000 and later.size - STREAM_EVERY < turn.fed <= later.size
    pcm = later[: later.size - 7000].tobytes()
    assert_same(turn.turn(50000, pcm), media_decoded(pcm))


def test_settled_is_a_prefix_of_every_later_decode():
    """What work ahead sends: the streamed output no later audio changes."""
    rng = np.random.default_rng(11)
    turn = streamed(SPEECH, 60000, rng)
    early = turn.settled()
    assert early.size > 30000
    for end in (60000, 80000, SPEECH.size):
        assert_same(media_decoded(SPEECH[:end].tobytes())[: early.size], early)
