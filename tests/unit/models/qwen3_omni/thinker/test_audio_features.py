"""Audio features kept between turns (thinker/audio_features.py): a batch of settled items takes
each one's features from the cache and they are the extractor's own; any other batch is the
extractor's call."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gateway.realtime.audio import settled
from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.models.qwen3_omni.thinker.audio_features import PROCESSOR_CALL, CachedAudioFeatures
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine
from tests.media_samples import tone


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return ThinkerEngine(
        tiny_model_dir, ThinkerEngineSettings(dtype="float32", max_batch=1, max_model_len=4096)
    )


def _conversation(audios):
    messages = []
    for i, audio in enumerate(audios):
        messages += [{"role": "user", "content": [{"type": "audio", "audio": audio}]}]
        messages += [{"role": "assistant", "content": f"Answer {i}."}]
    return messages[:-1]


def _prepared(engine, messages, cached: bool):
    wrapper = engine.processor.feature_extractor
    assert isinstance(wrapper, CachedAudioFeatures)
    if not cached:
        engine.processor.feature_extractor = wrapper.extractor
    try:
        return engine.prepare_media(messages)
    finally:
        engine.processor.feature_extractor = wrapper


def _same(a, b) -> None:
    assert a.prompt_ids == b.prompt_ids and a.layout == b.layout
    assert torch.equal(a.positions, b.positions) and a.rope_delta == b.rope_delta
    assert len(a.audio_features) == len(b.audio_features)
    for x, y in zip(a.audio_features, b.audio_features, strict=True):
        assert torch.equal(x, y)


def test_settled_turns_take_their_features_from_the_cache_and_they_are_the_extractors(engine):
    cache = engine.processor.feature_extractor
    audios = [settled(tone(s, hz=300 + 90 * i, seed=i)) for i, s in enumerate((1.3, 2.71, 0.9, 3.05))]
    for turns in range(1, len(audios) + 1):  # each turn adds a longer or a shorter one
        messages = _conversation(audios[:turns])
        hits, misses = cache.hits, cache.misses
        _same(_prepared(engine, messages, cached=True), _prepared(engine, messages, cached=False))
        assert cache.misses - misses <= 1 and cache.hits - hits >= turns - 1  # only the new one computed


def test_a_batch_with_an_unsettled_item_is_the_extractors_call(engine):
    cache = engine.processor.feature_extractor
    messages = _conversation(
        [settled(tone(1.1, seed=4)), tone(2.3, seed=5)]
    )  # the second as a client sent it
    hits, misses = cache.hits, cache.misses
    _same(_prepared(engine, messages, cached=True), _prepared(engine, messages, cached=False))
    assert (cache.hits, cache.misses) == (hits, misses)


def test_the_budget_keeps_the_most_recent_features_only(engine):
    small = CachedAudioFeatures(engine.processor.feature_extractor.extractor, budget_bytes=1)
    item = settled(tone(1.0, seed=9)).samples
    kwargs = {"sampling_rate": 16000, "padding": True, "truncation": False}
    kwargs |= {"return_attention_mask": True, "return_tensors": "pt"}
    small([item], **kwargs)
    small([item], **kwargs)
    assert (small.hits, small.misses) == (0, 2)  # over the budget: nothing kept
    assert not small.settled(np.ones(1600, dtype=np.float32)) and small.settled(item)


def test_a_read_only_item_is_hashed_once_and_a_writable_one_every_time(engine, monkeypatch):
    """Samples from the wire (and a scope's kept audio, the same array every turn) are read-only:
    their digest is kept while the array lives. A writable array could change in place, so it is
    hashed again each time, and changed samples get their own features."""
    import omnistream.models.qwen3_omni.thinker.audio_features as module

    frozen = settled(tone(1.1, hz=410, seed=7))
    frozen.samples.flags.writeable = False
    writable = settled(tone(1.2, hz=520, seed=8))
    # Their frame counts seen once (with other samples): their replacements are known.
    _prepared(engine, _conversation([settled(tone(1.1, seed=17)), settled(tone(1.2, seed=18))]), cached=True)
    real, calls = module.hashlib.sha256, []
    # This module's hashing only (prefix caching hashes the features too, media_item.py).
    counting = SimpleNamespace(sha256=lambda data: calls.append(len(data)) or real(data))
    monkeypatch.setattr(module, "hashlib", counting)
    for _ in range(3):
        _prepared(engine, _conversation([frozen, writable]), cached=True)
    assert len(calls) == 1 + 3  # the read-only item once, the writable one at every build
    before = _prepared(engine, _conversation([writable]), cached=True)
    writable.samples[:800] *= 0.5  # same array, new samples
    _same(
        _prepared(engine, _conversation([writable]), cached=True),
        _prepared(engine, _conversation([writable]), cached=False),
    )
    assert not torch.equal(
        before.audio_features[0], _prepared(engine, _conversation([writable]), cached=True).audio_features[0]
    )


def test_a_prompt_of_settled_audio_only_skips_the_processor_and_is_its_prompt(engine, monkeypatch):
    """The spoken turns of a conversation: features item by item from the cache and each item's
    replacement by its frame count, no processor call once every count was seen; the prompt is
    the processor's (ids, positions, features, layout)."""
    audios = [settled(tone(s, hz=200 + 70 * i, seed=20 + i)) for i, s in enumerate((1.7, 2.2, 1.7))]
    messages = _conversation(audios)
    expected = _prepared(engine, messages, cached=False)  # the processor's whole call
    _prepared(engine, messages, cached=True)  # every frame count seen once
    calls = []
    processor = engine.processor

    class Counting:
        def __getattr__(self, name):
            return getattr(processor, name)

        def __call__(self, *args, **kwargs):
            calls.append(kwargs)
            return processor(*args, **kwargs)

    monkeypatch.setattr(engine.media_prompts, "processor", Counting())
    _same(engine.prepare_media(messages), expected)
    assert calls == []
    # An image beside them: the processor's path, as before.
    from tests.media_samples import image

    shown = [*messages, {"role": "assistant", "content": "ok"}]
    shown.append({"role": "user", "content": [{"type": "image", "image": image()}]})
    engine.prepare_media(shown)
    assert len(calls) == 1


class CountingProcessor:
    """The engine's processor, its calls counted."""

    def __init__(self, processor) -> None:
        self.processor = processor
        self.calls: list[dict] = []

    def __getattr__(self, name):
        return getattr(self.processor, name)

    def __call__(self, *args, **kwargs):
        self.calls.append(kwargs)
        return self.processor(*args, **kwargs)


@pytest.mark.parametrize("rule_holds", [True, False])
def test_a_turn_of_a_length_never_seen_needs_no_processor_call_once_the_rule_was_checked(
    engine, monkeypatch, rule_holds
):
    """A realtime turn's length is new every turn: once the processor's replacement for one count
    was its placeholder times the encoder's rows (`audio_tokens`), a new count's replacement is
    that rule's, with no processor call (which would compute the item's features again), and the
    prompt is the processor's. A rule that disagrees on the checked count is never used."""
    builder = engine.media_prompts
    monkeypatch.setattr(builder, "_audio_replacements", {})
    monkeypatch.setattr(builder, "_replacement_rule", None)
    if not rule_holds:
        monkeypatch.setattr(builder, "_counted_replacement", lambda n: "<wrong>")
    first = _conversation([settled(tone(1.37, seed=41))])
    _same(_prepared(engine, first, cached=True), _prepared(engine, first, cached=False))
    assert builder._replacement_rule is rule_holds
    counting = CountingProcessor(builder.processor)
    monkeypatch.setattr(builder, "processor", counting)
    for seconds in (0.93, 2.61, 4.07):  # counts never seen, across encoder chunks
        messages = _conversation([settled(tone(seconds, seed=42))])
        calls = len(counting.calls)
        got = engine.prepare_media(messages)
        assert (len(counting.calls) == calls) is rule_holds
        monkeypatch.setattr(builder, "processor", counting.processor)
        _same(got, _prepared(engine, messages, cached=False))
        monkeypatch.setattr(builder, "processor", counting)


def test_an_item_the_processor_sees_otherwise_turns_the_shortcut_off(engine, monkeypatch):
    builder = engine.media_prompts
    monkeypatch.setattr(builder, "_audio_replacements", {})
    audio = settled(tone(1.4, seed=31))
    cache = engine.processor.feature_extractor
    rows, mask = cache.item(audio.samples, 16000)
    n = int(mask.sum())
    assert builder._audio_replacement(audio.samples, rows[:, :n] + 1.0, n) is None
    assert builder._audio_replacements is None  # from now on every prompt goes through the processor
    messages = _conversation([audio])
    _same(engine.prepare_media(messages), _prepared(engine, messages, cached=False))


def test_an_audio_only_prompt_s_positions_are_the_model_s_and_a_rule_that_differs_turns_it_off(
    engine, monkeypatch
):
    """Once the model's rule was found to give an audio-only prompt consecutive positions, such
    prompts take them without walking their items; checked against `get_rope_index` itself."""
    builder, model = engine.media_prompts, engine.thinker.model
    messages = _conversation(
        [settled(tone(s, hz=250 + 60 * i, seed=40 + i)) for i, s in enumerate((1.2, 2.6))]
    )
    engine.prepare_media(messages)
    assert builder._audio_positions_sequential is True
    prompt = engine.prepare_media(messages)
    ids = torch.tensor([prompt.prompt_ids])
    lengths = torch.tensor([f.shape[1] for f in prompt.audio_features])
    positions, delta = model.get_rope_index(ids, None, None, torch.ones_like(ids), False, lengths, None)
    assert torch.equal(prompt.positions, positions[:, 0].float()) and prompt.rope_delta == float(delta[0, 0])

    # A model whose rule is not consecutive: found on its first prompt, and then always asked.
    real = model.get_rope_index

    def shifted(*args):
        found, found_delta = real(*args)
        return found + 1, found_delta - 1

    monkeypatch.setattr(builder, "_audio_positions_sequential", None)
    monkeypatch.setattr(model, "get_rope_index", shifted)
    for _ in range(2):
        prompt = engine.prepare_media(messages)
        assert builder._audio_positions_sequential is False
        assert (
            torch.equal(prompt.positions, positions[:, 0].float() + 1)
            and prompt.rope_delta == float(delta[0, 0]) - 1
        )


def _extractors_call(extractor, item: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    out = extractor([item], sampling_rate=16000, **PROCESSOR_CALL)
    n = int(out["attention_mask"][0].sum())
    return out["input_features"][0, :, :n], out["attention_mask"][0, :n]


def test_an_item_alone_is_the_extractors_call_bit_for_bit_at_every_length_and_loudness(engine):
    """A settled item's features are computed without the extractor's batching (the commit's work,
    growing with the turn): the same numbers, frame mask and dtypes, over many lengths and seeds."""
    extractor = engine.processor.feature_extractor.extractor
    alone = CachedAudioFeatures(extractor)
    rng = np.random.default_rng(61)
    for _ in range(40):
        item = settled(
            tone(
                float(rng.uniform(0.05, 9.5)),
                hz=float(rng.uniform(80, 4000)),
                seed=int(rng.integers(1 << 30)),
            )
        )
        samples = item.samples * np.float32(rng.uniform(1e-4, 1.0))
        samples.flags.writeable = False  # as from the wire
        features, mask = alone.item(samples, 16000)
        want_features, want_mask = _extractors_call(extractor, samples)
        assert features.dtype == want_features.dtype and mask.dtype == want_mask.dtype
        assert torch.equal(features, want_features) and torch.equal(mask, want_mask)


def test_a_dithering_extractor_is_called_as_it_is(engine):
    extractor = engine.processor.feature_extractor.extractor
    calls = []

    class Dithering:
        dither = 1e-5
        hop_length, n_fft = extractor.hop_length, extractor.n_fft
        _torch_extract_fbank_features = extractor._torch_extract_fbank_features

        def __call__(self, audio, **kwargs):
            calls.append(len(audio))
            return extractor(audio, **kwargs)

    item = settled(tone(1.2, seed=3)).samples
    features, _ = CachedAudioFeatures(Dithering()).item(item, 16000)
    assert calls == [1] and torch.equal(features, _extractors_call(extractor, item)[0])


def test_a_turn_worked_on_while_spoken_commits_with_the_features_and_prompt_computed_whole(engine):
    """The work ahead's prefixes (prepare_media ahead=True, as an encode_only request) keep the
    turn's frames; its commit's prompt, features included, is the one computed from scratch."""
    turn = tone(6.3, hz=220, seed=11)
    for seconds in (2, 4, 6):
        prefix = {"type": "audio", "audio": type(turn)(turn.samples[: seconds * 16000 - 123])}
        engine.prepare_media([{"role": "user", "content": [prefix]}], ahead=True)
    reused = engine.turn_frames.reused
    messages = _conversation([settled(turn)])
    _same(_prepared(engine, messages, cached=True), _prepared(engine, messages, cached=False))
    assert engine.turn_frames.reused == reused + 1
