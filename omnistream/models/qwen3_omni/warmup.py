"""Warm-up requests for the Qwen3-Omni engines: the smallest input each stage accepts.

A stage reports SERVING only after one of these ran, so lazy allocations (KV slots, kernels, the
Code2Wav's first streaming step) happen before the first client, not inside its time to first audio.
The talker's input must look like a real chat (it looks for the assistant turn), hence the ChatML
ids from the config rather than arbitrary tokens.
"""

from __future__ import annotations

import torch

from omnistream.engine.engine import Engine
from omnistream.models.qwen3_omni.codec_chunks import ChunkPlan


def talker_warmup_prompt(config) -> list[int]:
    """`<|im_start|>user X<|im_end|> X<|im_start|>assistant X`: the shortest prompt with a user turn
    and an assistant turn, built from the checkpoint's own special-token ids."""
    return [
        config.im_start_token_id,
        config.user_token_id,
        0,
        config.im_end_token_id,
        0,
        config.im_start_token_id,
        config.assistant_token_id,
        0,
    ]


async def _drain(out) -> None:
    async for _ in out:
        pass


async def warm_thinker(engine: Engine) -> None:
    from omnistream.models.qwen3_omni.thinker.engine import ThinkerParams

    await _drain(engine.add_request("warmup", [0, 1, 2], ThinkerParams(max_tokens=2, ignore_eos=True)))


async def warm_talker(engine: Engine) -> None:
    from omnistream.models.qwen3_omni.talker.engine import TalkerParams

    out = engine.add_request("warmup", TalkerParams(max_frames=2))
    engine.feed("warmup", [0], True, prompt_ids=talker_warmup_prompt(engine.config))
    await _drain(out)


async def warm_code2wav(engine: Engine) -> None:
    out = engine.add_request("warmup", ChunkPlan(2, 25, 25))
    engine.feed("warmup", torch.zeros((engine.num_quantizers, 3), dtype=torch.long), True)
    await _drain(out)


WARMERS = {"thinker": warm_thinker, "talker": warm_talker, "code2wav": warm_code2wav}
