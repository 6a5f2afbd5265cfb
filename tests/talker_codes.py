"""Every request's talker frames from one engine run, all input given before the engine starts, so
runs under other settings (static frames, graph buckets, an experts kernel) see the same batches and
can be compared frame for frame."""

from __future__ import annotations

import asyncio

from omnistream.engine.load_options import LoadOptions
from omnistream.engine.settings import TalkerEngineSettings, ThinkerEngineSettings, derive
from omnistream.models.qwen3_omni.talker.engine import TalkerEngine
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine
from omnistream.request.sampling_params import SamplingParams
from omnistream.request.stage_chain import TalkerParams


def talker_codes(
    model_dir: str,
    sampling: list[SamplingParams],
    options: LoadOptions,
    max_frames: int = 16,
    graph_buckets: bool = False,
) -> list[list[list[int]]]:
    """Request i gets `sampling[i]` and its text's first 2 + i ids, ending there."""
    engine = TalkerEngine(
        model_dir,
        derive(TalkerEngineSettings, options, max_batch=4, max_model_len=256),
        graph_buckets=graph_buckets,
    )
    if graph_buckets:
        assert engine.frame is not None and engine.frame.buckets == (1, 2, 4)
    chat = derive(ThinkerEngineSettings, LoadOptions(dtype="float32"), max_batch=1, max_model_len=256)
    prompt = ThinkerEngine(model_dir, chat).encode_chat([{"role": "user", "content": "hello"}])

    async def run():
        outputs = []
        for i, params in enumerate(sampling):
            outputs.append(engine.add_request(f"r{i}", TalkerParams(max_frames=max_frames, sampling=params)))
            engine.feed(f"r{i}", [5 + i, 6, 7, 8, 9, 10][: 2 + i], last=True, prompt_ids=prompt)
        engine.start()
        return [[item.codes async for item in out if item.codes is not None] for out in outputs]

    try:
        return asyncio.run(run())
    finally:
        engine.stop()
