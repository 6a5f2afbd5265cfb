"""The thinker's prefix caching (thinker/prefix.py): a conversation's turns reuse the KV (and the
deep rows) of what earlier turns computed, and every output is the one the cache-off engine gives."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.models.qwen3_omni.thinker import thinker_media
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine, ThinkerParams
from tests.media_samples import image, tone


def _engine(model_dir: str, **kwargs) -> ThinkerEngine:
    e = ThinkerEngine(
        model_dir, ThinkerEngineSettings(dtype="float64", max_batch=4, max_model_len=512, **kwargs)
    )
    e.start()
    return e


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    on, off = _engine(tiny_model_dir), _engine(tiny_model_dir, prefix_cache_gib=0)
    yield on, off
    on.stop()
    off.stop()


async def _outputs(engine, rid, ids, media=None, max_tokens=10):
    outputs = [o async for o in engine.add_request(rid, ids, ThinkerParams(max_tokens, True), media=media)]
    return [t for o in outputs for t in o.token_ids], outputs[0].prompt_hidden


def _run(engine, rid, ids, media=None, max_tokens=10):
    return asyncio.run(_outputs(engine, rid, ids, media, max_tokens))


def _turns(engine, texts):
    messages, prompts = [], []
    for i, text in enumerate(texts):
        messages.append({"role": "user", "content": text})
        prompts.append(engine.encode_chat(messages))
        messages.append({"role": "assistant", "content": f"Answer number {i} is about the sea."})
    return prompts


def test_each_turn_of_a_conversation_reuses_the_last_and_answers_as_without_the_cache(engines):
    on, off = engines
    on.prefix_cache.clear()
    prompts = _turns(on, [f"Turn {i}: tell me about the sea, the sky and the hills." for i in range(5)])
    hits_before = on.prefix_cache.stats.hits
    for turn, ids in enumerate(prompts):
        tokens, _ = _run(on, f"conv-{turn}", ids)
        assert tokens == _run(off, f"conv-off-{turn}", ids)[0]
    stats = on.prefix_cache.stats
    # Every later turn found at least the turns before it (block-aligned, less its last position).
    assert stats.hits - hits_before >= sum(len(p) - 16 for p in prompts[:-1])
    assert off.prefix_cache.stats.hits == 0 and len(off.prefix_cache) == 0


def test_a_prompt_sharing_part_of_a_cached_one_and_requests_batched_match_the_cache_off(engines):
    on, off = engines
    on.prefix_cache.clear()
    base = _turns(on, ["Describe a long quiet river at dawn, with birds and mist, in detail."])[0]
    _run(on, "base", base)
    part = base[:20] + on.encode_chat([{"role": "user", "content": "Something else entirely."}])
    hits = on.prefix_cache.stats.hits
    assert _run(on, "part", part)[0] == _run(off, "part-off", part)[0]
    assert on.prefix_cache.stats.hits - hits == 16  # the one whole block they share

    async def batched(engine):
        return await asyncio.gather(*(_outputs(engine, f"b{i}-{id(engine)}", base) for i in range(3)))

    assert [t for t, _ in asyncio.run(batched(on))] == [t for t, _ in asyncio.run(batched(off))]


def test_a_prefix_evicted_midway_reuses_what_is_left_and_still_matches(tiny_model_dir, engines):
    _, off = engines
    small = _engine(tiny_model_dir, prefix_cache_gib=1 / (1 << 30))  # one byte
    try:
        block = small.prefix_cache.block_size
        per_block = sum(
            t[0, :, :block].numel() * t.element_size() for t in small.cache.keys + small.cache.values
        )
        small.prefix_cache.budget_bytes = 3 * per_block  # 3 blocks: a 70-token prompt keeps 3 of 4
        ids = _turns(small, ["A story of the mountains and the rivers, the towns and the long roads home."])[
            0
        ]
        _run(small, "first", ids)
        assert len(small.prefix_cache) == 3
        longer = ids + small.encode_chat([{"role": "user", "content": "And then?"}])
        hits = small.prefix_cache.stats.hits
        assert _run(small, "again", longer)[0] == _run(off, "again-off", longer)[0]
        assert 0 < small.prefix_cache.stats.hits - hits < len(ids)
    finally:
        small.stop()


def _media_prompt(engine, content):
    return engine.prepare_media([{"role": "user", "content": content}])


def test_media_in_a_cached_prefix_is_not_encoded_again_and_its_deep_rows_come_back(engines, monkeypatch):
    on, off = engines
    on.prefix_cache.clear()
    first = _media_prompt(on, [{"type": "audio", "audio": tone(1.3)}, {"type": "image", "image": image()}])
    tokens, hidden = _run(on, "media-1", first.prompt_ids, first)
    off_tokens, off_hidden = _run(off, "media-1-off", first.prompt_ids, first)
    assert tokens == off_tokens and torch.equal(hidden, off_hidden)

    follow = on.prepare_media(
        [
            {
                "role": "user",
                "content": [{"type": "audio", "audio": tone(1.3)}, {"type": "image", "image": image()}],
            },
            {"role": "assistant", "content": "It is a tone and a picture."},
            {"role": "user", "content": "What came first?"},
        ]
    )
    encoded = []
    real = thinker_media.encode_slices

    def counting(model, slices):
        encoded.extend(s.kind for s in slices)
        return real(model, slices)

    monkeypatch.setattr("omnistream.models.qwen3_omni.thinker.encoded_windows.encode_slices", counting)
    hits = on.prefix_cache.stats.hits
    tokens, hidden = _run(on, "media-2", follow.prompt_ids, follow)
    assert encoded == []  # both items lie in the reused prefix
    # The whole first prompt, its last partial block included (the media sit in that block).
    assert on.prefix_cache.stats.hits - hits == len(first.prompt_ids)
    monkeypatch.undo()
    off_tokens, off_hidden = _run(off, "media-2-off", follow.prompt_ids, follow)
    assert tokens == off_tokens
    assert torch.equal(hidden, off_hidden)  # the talker gets the same deep rows, cached or computed


def test_other_media_at_the_same_place_is_never_a_hit(engines):
    on, off = engines
    on.prefix_cache.clear()
    a = _media_prompt(
        on, [{"type": "audio", "audio": tone(1.3, hz=440)}, {"type": "text", "text": "Hear it?"}]
    )
    b = _media_prompt(
        on, [{"type": "audio", "audio": tone(1.3, hz=660)}, {"type": "text", "text": "Hear it?"}]
    )
    assert a.prompt_ids == b.prompt_ids  # same placeholders: only the content tells them apart
    _run(on, "tone-a", a.prompt_ids, a)
    hits = on.prefix_cache.stats.hits
    tokens, hidden = _run(on, "tone-b", b.prompt_ids, b)
    first_audio = b.prompt_ids.index(on.config.thinker_config.audio_token_id)
    assert on.prefix_cache.stats.hits - hits <= first_audio  # at most the text before the audio
    off_tokens, off_hidden = _run(off, "tone-b-off", b.prompt_ids, b)
    assert tokens == off_tokens and torch.equal(hidden, off_hidden)


def test_an_aborted_request_stores_its_prompt_but_nothing_of_its_answer(engines):
    on, _ = engines
    on.prefix_cache.clear()
    ids = _turns(on, ["Count the waves on the shore, one by one, slowly and carefully."])[0]

    steps = on.stats.steps

    async def abort_after_first():
        out = on.add_request("aborted", ids, ThinkerParams(200, True))
        await out.get()
        on.abort("aborted")

    asyncio.run(abort_after_first())
    # The prompt is stored once its second token is sent or, as here if the abort came first, when
    # the request ends: before its slot goes.
    deadline = time.monotonic() + 10
    while on.stats.steps == steps and time.monotonic() < deadline:
        time.sleep(0.001)
    on.release_ended()
    assert on.prefix_cache.positions == len(
        ids
    )  # the prompt's blocks and its partial last one, no answer token


def test_a_scope_is_found_by_its_own_requests_only_and_gone_once_released(engines):

    on, off = engines
    on.prefix_cache.clear()
    ids = _turns(on, ["Which birds sing at dawn by the river, and which at night?"])[0]
    expected = _run(off, "scoped-off", ids)[0]

    def run(rid: str, scope: bytes) -> int:
        hits = on.prefix_cache.stats.hits
        params = ThinkerParams(10, True, cache_scope=scope)

        async def tokens():
            return [t async for o in on.add_request(rid, ids, params) for t in o.token_ids]

        assert asyncio.run(tokens()) == expected
        return on.prefix_cache.stats.hits - hits

    assert run("alice-1", b"alice") == 0 and run("bob-1", b"bob") == 0
    assert run("alice-2", b"alice") >= len(ids) - 16
    held = len(on.prefix_cache)
    on.release_cache_scope(b"alice")
    deadline = time.monotonic() + 10
    while len(on.prefix_cache) >= held and time.monotonic() < deadline:
        time.sleep(0.01)
    assert run("alice-3", b"alice") == 0
    assert run("bob-2", b"bob") >= len(ids) - 16


def test_each_block_key_chains_its_tokens_its_m_rope_positions_and_the_items_it_holds(engines):
    """The keys of a prompt's blocks, taken all at once, are each block's own rule chained: a
    block whose M-RoPE positions are not its indexes (after an image) carries them, and a block
    holding placeholders of a media item carries that item's digest."""
    import hashlib

    from omnistream.models.qwen3_omni.thinker.state import _ThinkerState

    on, _ = engines
    content = [
        {"type": "audio", "audio": tone(1.3)},
        {"type": "image", "image": image()},
        {"type": "text", "text": "Describe both, then the second tone."},
        {"type": "audio", "audio": tone(0.9, hz=660)},
    ]
    media = _media_prompt(on, content)
    state = _ThinkerState(request_id="keys", output=None, prompt_ids=list(media.prompt_ids), media=media)
    on.prefixes.plan(state)
    ids, size, positions = state.prompt_ids, on.prefix_cache.block_size, state.prompt_positions
    expected, parent = [], on.prefix_cache.root(b"")
    plain_blocks = item_blocks = 0
    for b in range(len(ids) // size):
        lo, hi = b * size, (b + 1) * size
        block = positions[:, lo:hi]
        plain = bool((block == torch.arange(lo, hi, dtype=torch.float64)).all())
        items = [item.digest for item in state.items if item.first < hi and item.last >= lo]
        plain_blocks += plain
        item_blocks += bool(items)
        salt = b""
        if not plain or items:
            h = hashlib.sha256(b"" if plain else b"positions\0" + block.contiguous().numpy().tobytes())
            for digest in items:
                h.update(digest)
            salt = h.digest()
        parent = on.prefix_cache.digests(ids[lo:hi], [salt], b"", parent)[0]
        expected.append(parent)
    assert state.prefix_keys == expected
    # The prompt has blocks of every kind: plain text, items, positions moved by the image.
    assert 0 < plain_blocks < len(expected) and 0 < item_blocks < len(expected)


def test_the_prompt_is_stored_after_the_second_token_not_between_the_first_two(tiny_model_dir):
    """A prompt's store (a copy of its new KV blocks) would delay the answer's second token, which is
    the first text a client sees when the first token is a byte of an unfinished character. Steps
    run on this thread (the engine thread not started), one at a time."""
    engine = ThinkerEngine(
        tiny_model_dir, ThinkerEngineSettings(dtype="float64", max_batch=2, max_model_len=512)
    )
    ids = _turns(engine, ["Tell me about the tides and the moon, and why they follow each other."])[0]

    async def two_steps() -> list[tuple[int, int]]:
        engine.add_request("two-steps", ids, ThinkerParams(8, True))  # its output needs a running loop
        state, seen = engine.state("two-steps"), []
        for _ in range(2):
            work = engine.plan_step()
            assert work is not None
            engine.run_step(work)
            seen.append((len(state.generated), engine.prefix_cache.positions))
        return seen

    # Nothing stored at the first token; the prompt's blocks and its partial last one at the second.
    assert asyncio.run(two_steps()) == [(1, 0), (2, len(ids))]
