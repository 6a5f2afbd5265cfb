"""Work ahead (ThinkerParams.encode_only): the windows of a turn's audio encoded while it is spoken
are the committed request's own, so its answer is the one it gets without them; windows whose
features changed (a louder part later) are encoded again."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from gateway.realtime.audio import settled
from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.models.qwen3_omni.thinker.encoded_windows import EncodedWindows, window_key
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine, ThinkerParams
from omnistream.request.media import AudioInput
from tests.media_samples import tone

SCOPE = b"a realtime session"


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = ThinkerEngine(tiny_model_dir, ThinkerEngineSettings(dtype="float64", max_batch=4, max_model_len=8192))
    e.start()
    yield e
    e.stop()


def test_kept_windows_are_bounded_keyed_by_scope_and_content_and_released_with_their_scope():
    rows = torch.ones(10, 4, dtype=torch.float64)  # 320 bytes
    windows = EncodedWindows(budget_bytes=700)
    a = torch.zeros(2, 3)
    assert window_key(b"s", a) != window_key(b"t", a) != window_key(b"s", a.double())
    assert window_key(b"s", a) == window_key(b"s", a.clone()) != window_key(b"s", a + 1e-7)
    windows.put(b"k1", b"s", rows)
    windows.put(b"k2", b"t", rows * 2)
    assert windows.get(b"k1") is not None  # k1 now the most recent
    windows.put(b"k3", b"s", rows * 3)  # over the budget: the least recent (k2) goes
    assert windows.get(b"k2") is None and len(windows) == 2
    windows.release(b"s")
    assert len(windows) == 0 and (windows.hits, windows.misses) == (1, 1)


def _speech(seconds: float, tail_gain: float) -> np.ndarray:
    """A turn's audio: half a second of digital silence, then sound whose last half second is
    scaled by `tail_gain`. The silence's log-mel frames sit at the item's clamp (its maximum less 8),
    so a louder tail changes them and only them."""
    samples = tone(seconds, hz=300).samples.copy()
    samples[:8000] = 0.0
    samples[-8000:] *= tail_gain
    return samples


def _run(engine, rid: str, audio: AudioInput, params: ThinkerParams) -> list:
    media = engine.prepare_media([{"role": "user", "content": [{"type": "audio", "audio": audio}]}])

    async def collect():
        return [s async for s in engine.add_request(rid, media.prompt_ids, params, media=media)]

    return asyncio.run(collect())


@pytest.mark.parametrize(("tail_gain", "reused"), [(0.5, 2), (3.0, 1)])
def test_a_committed_turn_takes_the_windows_encoded_ahead_and_answers_as_without(engine, tail_gain, reused):
    samples = _speech(6.5, tail_gain)
    windows = engine.encoded_windows
    windows.release(SCOPE)
    # While spoken: 6.0 s of it, 600 frames; the 200-frame windows whose frames are final: two.
    ahead = _run(
        engine,
        f"ahead-{tail_gain}",
        AudioInput(samples[:96000]),
        ThinkerParams(encode_only=True, cache_scope=SCOPE),
    )
    assert [(s.token_ids, s.finished, s.finish_reason) for s in ahead] == [([], True, "stop")]
    assert len(windows) == 2
    hits = windows.hits
    turn = settled(AudioInput(samples))
    answer = _run(engine, f"turn-{tail_gain}", turn, ThinkerParams(8, True, cache_scope=SCOPE))
    assert windows.hits - hits == reused  # a louder tail: the window with the silence is encoded again
    alone = _run(engine, f"alone-{tail_gain}", turn, ThinkerParams(8, True, cache_scope=b"another"))
    assert [s.token_ids for s in answer] == [s.token_ids for s in alone]
    assert torch.equal(answer[0].prompt_hidden, alone[0].prompt_hidden)
