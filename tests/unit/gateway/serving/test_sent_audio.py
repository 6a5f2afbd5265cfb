"""What the gateway knows each thinker replica holds of a scope's audio (gateway/serving/sent_audio.py)."""

from __future__ import annotations

import numpy as np

from gateway.serving.sent_audio import SentAudio, message_audio
from omnistream.request.media import AudioInput, VideoInput, audio_digest


def clip(v: float) -> AudioInput:
    return AudioInput(np.full(160, v, dtype=np.float32))


def said(*audio: AudioInput) -> list[dict]:
    return [{"role": "user", "content": [{"type": "audio", "audio": a}]} for a in audio]


def test_nothing_is_referred_before_the_replica_accepted_it():
    sent, a = SentAudio(), clip(0.1)
    assert sent.referrer(b"s", "thinker:1") is None
    sent.confirm(b"s", "thinker:1", said(a))
    refer = sent.referrer(b"s", "thinker:1")
    assert refer is not None and refer(a) == audio_digest(a) and refer(clip(0.2)) is None
    assert sent.referrer(b"s", "thinker:2") is None  # another replica holds nothing of it
    assert sent.referrer(b"other", "thinker:1") is None


def test_the_shared_scope_never_refers():
    sent = SentAudio()
    sent.confirm(b"", "thinker:1", said(clip(0.1)))
    assert sent.referrer(b"", "thinker:1") is None


def test_forget_release_and_the_bound():
    sent = SentAudio(max_entries=2)
    for scope in (b"a", b"b"):
        sent.confirm(scope, "t:1", said(clip(0.1)))
    sent.forget(b"a", "t:1")
    assert sent.referrer(b"a", "t:1") is None and sent.referrer(b"b", "t:1") is not None
    sent.confirm(b"b", "t:2", said(clip(0.1)))
    sent.release(b"b")
    assert sent.referrer(b"b", "t:1") is None and sent.referrer(b"b", "t:2") is None
    for scope in (b"x", b"y", b"z"):
        sent.confirm(scope, "t:1", said(clip(0.1)))
    assert sent.referrer(b"x", "t:1") is None  # the least recently used pair went
    assert sent.referrer(b"z", "t:1") is not None


def test_only_message_audio_counts_not_a_videos_sound():
    a, sound = clip(0.1), clip(0.3)
    video = VideoInput(np.zeros((1, 2, 2, 3), np.uint8), 2.0, sound)
    messages = [
        {"role": "system", "content": "text"},
        {"role": "user", "content": [{"type": "audio", "audio": a}, {"type": "video", "video": video}]},
    ]
    assert list(message_audio(messages)) == [a]
