"""What a request brings (media features, deep hidden rows, codes) is put on the engine's device and
in its dtype by the engine, once, at admission: a bfloat16 engine takes float32 and float64 input.
(Device placement is the same `.to` call; on CPU the dtype is what can be checked.)"""

from __future__ import annotations

import asyncio

import pytest
import torch

from omnistream.engine.load_options import LoadOptions
from omnistream.engine.settings import (
    Code2WavEngineSettings,
    TalkerEngineSettings,
    ThinkerEngineSettings,
    derive,
)
from omnistream.models.qwen3_omni.code2wav.engine import Code2WavEngine
from omnistream.models.qwen3_omni.codec_chunks import ChunkPlan
from omnistream.models.qwen3_omni.talker.engine import TalkerEngine, TalkerParams
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine, ThinkerParams
from tests.media_samples import tone

BF16 = LoadOptions(dtype="bfloat16")


@pytest.fixture(scope="module")
def thinker(tiny_model_dir):
    engine = ThinkerEngine(
        tiny_model_dir, derive(ThinkerEngineSettings, BF16, max_batch=2, max_model_len=1024)
    )
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def talker(tiny_model_dir):
    engine = TalkerEngine(tiny_model_dir, derive(TalkerEngineSettings, BF16, max_batch=2, max_model_len=1024))
    engine.start()
    yield engine
    engine.stop()


def test_media_features_are_cast_at_admission_and_the_request_runs(thinker):
    media = thinker.prepare_media([{"role": "user", "content": [{"type": "audio", "audio": tone(1.0)}]}])
    assert all(f.dtype == torch.float32 for f in media.audio_features)  # as the processor made them

    async def run():
        out = thinker.add_request("m", media.prompt_ids, ThinkerParams(max_tokens=3), media=media)
        admitted = thinker.state("m").media
        assert admitted is not None and all(f.dtype == torch.bfloat16 for f in admitted.audio_features)
        thinker.start()
        return [s async for s in out]

    steps = asyncio.run(run())
    assert len(steps) == 3 and steps[-1].finished
    assert steps[0].prompt_hidden is not None and steps[0].prompt_hidden.dtype == torch.bfloat16


@pytest.mark.parametrize("row_dtype", [torch.float32, torch.float64])
def test_hidden_rows_of_any_float_dtype_are_cast_and_the_talker_speaks(thinker, talker, row_dtype):
    media = thinker.prepare_media([{"role": "user", "content": [{"type": "audio", "audio": tone(0.5)}]}])
    ids = media.prompt_ids
    positions = [i for i, t in enumerate(ids) if t in talker.prompts.multimodal_ids]
    assert positions
    rows = {p: torch.randn(talker.hidden_width, dtype=row_dtype) for p in positions}

    async def run():
        rid = f"rows-{row_dtype}"
        out = talker.add_request(rid, TalkerParams(max_frames=4))
        # The prompt alone: the assistant turn has no content token yet, so it cannot prefill.
        talker.feed(rid, [], last=False, prompt_ids=ids, multimodal_hidden=rows)
        hidden = talker.state(rid).multimodal_hidden
        assert hidden is not None and all(r.dtype == torch.bfloat16 for r in hidden.values())
        talker.feed(rid, [5, 6, 7, 8], last=True)
        return [s async for s in out]

    frames = asyncio.run(run())
    assert len(frames) == 4 and frames[-1].finished and all(len(f.codes) == 16 for f in frames)


def test_code2wav_keeps_codes_on_its_device_as_int64(tiny_model_dir):
    engine = Code2WavEngine(tiny_model_dir, derive(Code2WavEngineSettings, BF16, max_batch=2))

    async def run():
        engine.add_request("c", ChunkPlan(4, 4, 0))
        engine.feed("c", torch.zeros((engine.num_quantizers, 3), dtype=torch.int32), last=False)
        frames = engine.state("c").frames
        assert frames[0].dtype == torch.int64 and frames[0].device == torch.device("cpu")

    asyncio.run(run())
