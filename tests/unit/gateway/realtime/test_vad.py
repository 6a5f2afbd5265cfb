"""The server VAD's pause (vad.py): over espeak-ng speech, a silence longer than `pause_ms` reports
`paused` at the very end of speech the `stopped` that follows commits, speech after it reports
`resumed`, and a pause as long as the window is never reported (the turn ends instead)."""

from __future__ import annotations

from gateway.realtime.vad import SpeechDetector
from tests.speech import pieces, silence_pcm16, speech_pcm16


def heard(detector: SpeechDetector, pcm: bytes) -> list[tuple[str, int]]:
    """(kind, sample) of every event, `pcm` fed in 20 ms appends as a microphone sends it."""
    return [(e.kind, e.sample) for piece in pieces(pcm) for e in detector.process(piece)]


def test_a_pause_is_reported_at_the_end_of_speech_the_decision_commits():
    pcm = silence_pcm16(0.3) + speech_pcm16("Hello there, how are you?") + silence_pcm16(0.9)
    events = heard(SpeechDetector(0.5, 500, pause_ms=200), pcm)
    assert [kind for kind, _ in events] == ["started", "paused", "stopped"]
    assert events[1][1] == events[2][1]  # the same end of speech: the speculation's audio is the turn's
    # without a pause the detector decides the same turn
    assert heard(SpeechDetector(0.5, 500), pcm) == [events[0], events[2]]


def test_speech_after_a_pause_resumes_the_turn():
    first, second = speech_pcm16("Hello there, how are you?"), speech_pcm16("And what is the weather today?")
    # 150 ms apart: ~340 ms of silence to the detector (espeak's quiet tail), between pause and window
    pcm = silence_pcm16(0.3) + first + silence_pcm16(0.15) + second + silence_pcm16(0.9)
    events = heard(SpeechDetector(0.5, 500, pause_ms=200), pcm)
    assert [kind for kind, _ in events] == ["started", "paused", "resumed", "paused", "stopped"]
    assert events[1][1] < events[2][1] < events[3][1] == events[4][1]
    assert heard(SpeechDetector(0.5, 500), pcm) == [events[0], events[4]]  # still one turn


def test_a_pause_as_long_as_the_window_is_never_reported():
    pcm = silence_pcm16(0.3) + speech_pcm16("Hello there, how are you?") + silence_pcm16(0.9)
    for pause_ms in (500, 800, None):
        events = heard(SpeechDetector(0.5, 500, pause_ms=pause_ms), pcm)
        assert [kind for kind, _ in events] == ["started", "stopped"], pause_ms
