"""The transformers reference for media prompts (greedy, float64): the same decoded arrays through
the same processor, then `Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True)`."""

from __future__ import annotations

import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

from omnistream.models.qwen3_omni.checkpoint import load_tokenizer
from omnistream.models.qwen3_omni.thinker.media_checks import check_media, processor_inputs
from omnistream.models.qwen3_omni.thinker.media_prompt import load_processor
from tests.media_samples import conversations
from tests.reference_runs import generate_greedy

MAX_TOKENS = 12
MAX_FRAMES = 24


def patch_reference_talker(model) -> None:
    """transformers 5.24's talker cannot run prompts with both audio and vision: its
    `get_rope_index` reads `talker_config.audio_config`, which does not exist (AttributeError).
    Give it the thinker's (the one its audio lengths belong to); nothing else changes. Runs
    `generate` also passes `talker_use_audio_in_video`, which `generate` hands only to the thinker."""
    model.talker.config.audio_config = model.config.thinker_config.audio_config


def reference_inputs(processor, messages, use_audio_in_video: bool) -> dict:
    """The processor call of the reference for decoded media (what `apply_chat_template` does
    after loading files)."""
    rendered = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    media = check_media(messages, use_audio_in_video)
    return dict(processor(**processor_inputs(rendered, media, use_audio_in_video)))


def reference_run(model, inputs: dict, use_audio_in_video: bool):
    """(generated tokens, codes [16, frames])."""
    prompt_len = inputs["input_ids"].shape[1]
    sequences, _, codes = generate_greedy(
        model,
        MAX_TOKENS,
        MAX_FRAMES,
        **inputs,
        use_audio_in_video=use_audio_in_video,
        talker_use_audio_in_video=use_audio_in_video,
    )
    return sequences[0, prompt_len:].tolist(), codes


def expected_outputs(model_dir: str) -> dict[str, tuple[list[int], list[int], object]]:
    """name -> (prompt ids, generated tokens, codes) of every conversation of media_samples."""
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float64, experts_implementation="eager"
    ).eval()
    patch_reference_talker(model)
    processor = load_processor(model_dir, load_tokenizer(model_dir))
    out = {}
    for name, (messages, aiv) in conversations().items():
        inputs = reference_inputs(processor, messages, aiv)
        tokens, codes = reference_run(model, inputs, aiv)
        out[name] = (inputs["input_ids"][0].tolist(), tokens, codes)
    return out
