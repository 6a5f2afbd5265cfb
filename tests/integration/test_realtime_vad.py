"""The server VAD (gateway/realtime/vad.py) on rendered speech and on noise (webrtcvad, not an energy
threshold). Here, not in tests/unit/, because the speech is rendered by espeak-ng, a Debian package."""

from __future__ import annotations

import numpy as np

from gateway.realtime.vad import INPUT_RATE, SpeechDetector, aggressiveness
from tests.speech import pieces, silence_pcm16, speech_pcm16


def run(detector: SpeechDetector, pcm: bytes) -> list[tuple[str, float]]:
    found = []
    for piece in pieces(pcm):
        found += [(e.kind, e.sample / INPUT_RATE) for e in detector.process(piece)]
    return found


def test_a_spoken_sentence_is_one_turn_with_its_bounds():
    speech = speech_pcm16("Hello there, how are you today?")
    pcm = silence_pcm16(0.5) + speech + silence_pcm16(1.0)
    found = run(SpeechDetector(0.5, 400), pcm)
    assert [k for k, _ in found] == ["started", "stopped"]
    (_, start), (_, end) = found
    seconds = len(speech) / 2 / INPUT_RATE
    assert 0.45 <= start <= 0.75
    assert 0.5 + seconds - 0.5 <= end <= 0.5 + seconds + 0.05


def test_a_pause_shorter_than_the_silence_duration_does_not_end_the_turn():
    word = speech_pcm16("Hello")
    pcm = silence_pcm16(0.3) + word + silence_pcm16(0.3) + word + silence_pcm16(1.0)
    assert [k for k, _ in run(SpeechDetector(0.5, 600), pcm)] == ["started", "stopped"]
    assert [k for k, _ in run(SpeechDetector(0.5, 200), pcm)] == ["started", "stopped", "started", "stopped"]


def test_silence_and_steady_noise_are_not_a_turn():
    """Noise as loud as quiet speech: an energy threshold would call all of it speech; the detector
    adapts to it (what it still calls speech is a few short blips, a tenth of the time at most)."""
    noise = np.random.default_rng(0).standard_normal(INPUT_RATE * 3) * 0.05
    pcm = (noise * 32767).astype("<i2").tobytes()
    assert run(SpeechDetector(0.5, 400), silence_pcm16(2.0)) == []
    found = run(SpeechDetector(0.9, 400), pcm)
    starts = [at for kind, at in found if kind == "started"]
    stops = [at for kind, at in found if kind == "stopped"]
    assert len(starts) == len(stops)
    assert sum(b - a for a, b in zip(starts, stops, strict=True)) <= 0.3


def test_any_piece_size_gives_the_same_result():
    pcm = silence_pcm16(0.4) + speech_pcm16("One two three") + silence_pcm16(1.0)
    whole = SpeechDetector(0.5, 400).process(pcm)
    odd = SpeechDetector(0.5, 400)
    split = [e for i in range(0, len(pcm), 1234) for e in odd.process(pcm[i : i + 1234])]
    assert whole == split


def test_threshold_maps_to_aggressiveness():
    assert [aggressiveness(t) for t in (0.0, 0.3, 0.5, 0.8, 1.0)] == [0, 1, 2, 3, 3]
