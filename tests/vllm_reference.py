"""The prompts and the transformers thinker's greedy tokens that the vLLM checkpoint is compared with
(the conversion's unit tests and the vLLM process test share them)."""

from __future__ import annotations

import asyncio

from omnistream.engine.chat_encoding import ChatEncoder
from omnistream.engine.settings import ThinkerEngineSettings
from omnistream.models.family import family_for
from omnistream.models.qwen3_omni.checkpoint import load_tokenizer
from omnistream.request.stage_chain import ThinkerParams

MAX_TOKENS = 24


def prompts(model_dir: str) -> list[list[int]]:
    """Prompts of 3, ~15, ~60 and 200 ids: two chats in the model's framing and two runs of ids."""
    chat = ChatEncoder(load_tokenizer(model_dir), 4096)
    story = chat.encode([{"role": "user", "content": "Tell me a story."}])
    system = {"role": "system", "content": "Be brief."}
    long = chat.encode([system, {"role": "user", "content": "the sea " * 25}])
    return [[5, 6, 7], story, long, [(i * 37) % 400 + 10 for i in range(200)]]


def transformers_greedy(model_dir: str, batch: list[list[int]]) -> list[list[int]]:
    """The project's thinker engine, each prompt alone, greedy, end of turn ignored."""

    async def run() -> list[list[int]]:
        engine = family_for(model_dir).engine(
            "thinker", model_dir, ThinkerEngineSettings(dtype="float32", max_batch=4)
        )
        engine.start()
        try:
            out = []
            for i, ids in enumerate(batch):
                params = ThinkerParams(max_tokens=MAX_TOKENS, ignore_eos=True)
                stream = engine.add_request(f"r{i}", ids, params)
                out.append([t async for o in stream for t in o.token_ids])
            return out
        finally:
            engine.stop()

    return asyncio.run(run())
