"""The thinker's kept audio per cache scope (omnistream/service/scope_audio.py)."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from omnistream.request.errors import InvalidRequest, MediaExpired
from omnistream.request.media import AudioInput, AudioRef, audio_digest
from omnistream.service.scope_audio import ScopeAudio, ScopeAudioCollector


def clip(seed: int, n: int = 1600) -> AudioInput:
    return AudioInput(np.random.default_rng(seed).standard_normal(n).astype(np.float32))


def user(audio) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": "hear"}, {"type": "audio", "audio": audio}]}


def ref(audio: AudioInput) -> AudioRef:
    return AudioRef(audio_digest(audio), audio.sample_rate)


def test_a_scope_gets_back_the_audio_it_sent_and_text_stays_as_it_was():
    store, audio = ScopeAudio(), clip(1)
    system = {"role": "system", "content": "Be brief."}
    assert store.resolve([system, user(audio)], b"s") == [system, user(audio)]
    resolved = store.resolve([system, user(ref(audio)), user(clip(2))], b"s")
    assert resolved[0] is system
    assert resolved[1]["content"][0] == {"type": "text", "text": "hear"}
    assert resolved[1]["content"][1]["audio"] is audio  # the very samples it was sent
    assert (store.hits, store.misses) == (1, 0)
    assert store.kept_bytes == 2 * audio.samples.nbytes  # the second turn's new audio is kept too


def test_a_digest_is_found_only_in_the_scope_that_sent_it():
    store, audio = ScopeAudio(), clip(1)
    store.resolve([user(audio)], b"mine")
    with pytest.raises(MediaExpired):
        store.resolve([user(ref(audio))], b"theirs")
    with pytest.raises(InvalidRequest, match="cache scope"):
        store.resolve([user(ref(audio))], b"")
    store.resolve([user(audio)], b"")  # the shared scope keeps nothing
    assert store.kept_bytes == audio.samples.nbytes and store.misses == 1


def test_another_rate_under_the_same_digest_is_not_that_audio():
    store, audio = ScopeAudio(), clip(1)
    store.resolve([user(audio)], b"s")
    with pytest.raises(MediaExpired):
        store.resolve([user(AudioRef(audio_digest(audio), 8000))], b"s")


def test_the_budget_drops_the_least_recently_used_first():
    one = clip(1).samples.nbytes
    store = ScopeAudio(budget_bytes=2 * one)
    a, b, c = clip(1), clip(2), clip(3)
    store.resolve([user(a), user(b)], b"s")
    store.resolve([user(ref(a))], b"s")  # a is used again: b is now the oldest
    store.resolve([user(c)], b"s")
    assert store.evictions == 1 and store.kept_bytes == 2 * one
    store.resolve([user(ref(a)), user(ref(c))], b"s")
    with pytest.raises(MediaExpired):
        store.resolve([user(ref(b))], b"s")
    too_big = clip(4, n=10 * 1600)
    store.resolve([user(too_big)], b"s")  # larger than the whole budget: not kept, nothing evicted
    assert store.evictions == 1


def test_a_released_scope_frees_its_audio_and_no_other():
    store = ScopeAudio()
    store.resolve([user(clip(1)), user(clip(2))], b"ended")
    store.resolve([user(clip(3))], b"open")
    assert store.release(b"ended") == 2
    assert store.kept_bytes == clip(3).samples.nbytes
    with pytest.raises(MediaExpired):
        store.resolve([user(ref(clip(1)))], b"ended")
    store.resolve([user(ref(clip(3)))], b"open")


def test_hits_misses_and_bytes_are_in_prometheus():
    store, audio = ScopeAudio(), clip(1)
    store.resolve([user(audio)], b"s")
    store.resolve([user(ref(audio))], b"s")
    registry = CollectorRegistry()
    registry.register(ScopeAudioCollector(store))
    scraped = generate_latest(registry).decode()
    assert "omnistream_thinker_scope_audio_hits_total 1.0" in scraped
    assert "omnistream_thinker_scope_audio_misses_total 0.0" in scraped
    assert f"omnistream_thinker_scope_audio_bytes {float(audio.samples.nbytes)}" in scraped
