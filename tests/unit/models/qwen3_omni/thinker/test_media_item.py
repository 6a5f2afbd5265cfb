"""A prompt's media items as prefix caching keys them: each item's digest is its content's, taken
where the prompt is built, and a conversation's re-sent audio is hashed once while it lives."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import omnistream.models.qwen3_omni.thinker.media_item as module
from gateway.realtime.audio import settled
from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine
from omnistream.models.qwen3_omni.thinker.media_item import item_digests, media_items
from tests.media_samples import image, tone


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return ThinkerEngine(tiny_model_dir, ThinkerEngineSettings(max_batch=2, max_model_len=1024))


def _conversation(*clips):
    messages = []
    for clip in clips:
        messages += [
            {"role": "user", "content": [{"type": "audio", "audio": clip}]},
            {"role": "assistant", "content": "Heard."},
        ]
    return messages[:-1]


def test_a_built_prompt_carries_its_items_digests_and_the_engine_uses_them(engine):
    media = engine.prepare_media(
        [
            {
                "role": "user",
                "content": [{"type": "audio", "audio": tone(1.1)}, {"type": "image", "image": image()}],
            }
        ]
    )
    assert media.digests is not None and [len(media.digests[k]) for k in ("audio", "image", "video")] == [
        1,
        1,
        0,
    ]
    items = media_items(media, media.prompt_ids, engine.config)
    assert [item.digest for item in items] == [media.digests["audio"][0], media.digests["image"][0]]
    # Taken on the engine thread when a prompt came without: another tag, never equal.
    media.digests = None
    assert {item.digest for item in media_items(media, media.prompt_ids, engine.config)}.isdisjoint(
        {item.digest for item in items}
    )


def test_re_sent_audio_is_hashed_once_while_its_features_live_and_again_once_changed(engine, monkeypatch):
    first, second = settled(tone(1.2, seed=31)), settled(tone(0.8, hz=520, seed=32))
    for clip in (first, second):
        clip.samples.flags.writeable = False  # as from the wire: the feature cache keeps them
    engine.prepare_media(_conversation(first))  # its features computed and kept
    real, calls = module.hashlib.sha256, []
    monkeypatch.setattr(module, "hashlib", SimpleNamespace(sha256=lambda data: calls.append(1) or real(data)))
    digests = [engine.prepare_media(_conversation(first, second)).digests["audio"] for _ in range(3)]
    assert digests[0] == digests[1] == digests[2] and digests[0][0] != digests[0][1]
    assert len(calls) <= 2  # each item at most once (the first may be known already)
    features = engine.prepare_media(_conversation(first)).audio_features[0]
    before = item_digests(engine.prepare_media(_conversation(first)))["audio"][0]
    features[0, 0] += 1.0  # the same tensor, changed in place: its digest is taken again
    assert item_digests(engine.prepare_media(_conversation(first)))["audio"][0] != before
    features[0, 0] -= 1.0
    assert torch.equal(features, engine.prepare_media(_conversation(first)).audio_features[0])
