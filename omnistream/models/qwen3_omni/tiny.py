"""Build the embedded tiny Qwen3-Omni checkpoint.

No model hub is reachable where this project is developed and tested, so the default model is a
randomly initialised `Qwen3OmniMoeForConditionalGeneration` with the real architecture shrunk to a few
megabytes, saved in the standard Hugging Face layout next to a byte-level tokenizer whose special
tokens match the config (tiny_tokenizer.py). Everything that loads a real checkpoint loads this one
the same way.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from omnistream.models.build_lock import build_lock
from omnistream.models.qwen3_omni.tiny_tokenizer import (
    BPE_VOCAB,
    CHAT_TEMPLATE,
    THINKER_VOCAB,
    build_tokenizer,
)

# Media preprocessing of the tiny checkpoint: the real model's recipe at the tiny encoders' sizes
# (patch 4 instead of 16, so the resize factor is 8; 16 mel bins instead of 128).
PATCH_SIZE = 4
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
MEL_BINS = 16
MIN_PIXELS = 8 * 8
MAX_PIXELS = 64 * 64
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


# Attention heads of the thinker's and the talker's transformers (and the code predictor's).
_HEADS = 4


def tiny_config(
    ids: dict[str, int],
    hidden_size: int = 64,
    layers: int = 2,
    experts: int = 4,
    code_predictor_layers: int = 1,
    top_k: tuple[int, int] = (2, 2),
) -> Any:
    """The tiny checkpoint's `Qwen3OmniMoeConfig`: the real architecture at `hidden_size`, with
    `layers` thinker and talker layers of `experts` experts, `top_k` of them active per token
    (thinker, talker); `ids`: the tokenizer's (`build_tokenizer`)."""
    from transformers import Qwen3OmniMoeConfig

    rope = _rope(hidden_size // _HEADS)  # one dict, the thinker's and the talker's
    return Qwen3OmniMoeConfig(
        thinker_config=_thinker_config(ids, hidden_size, layers, (experts, top_k[0]), rope),
        talker_config=_talker_config(
            ids, hidden_size, layers, (experts, top_k[1]), code_predictor_layers, rope
        ),
        code2wav_config=_code2wav_config(),
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<tts_pad>"],
        tts_bos_token_id=ids["<tts_text_bos>"],
        tts_eos_token_id=ids["<tts_text_eod>"],
        system_token_id=ids["system"],
        user_token_id=ids["user"],
        assistant_token_id=ids["assistant"],
    )


def _rope(head_dim: int) -> dict[str, Any]:
    """Interleaved multimodal RoPE: the head's rotary half split into time, height and width."""
    half = head_dim // 2
    mrope = [half - 2 * (half // 4), half // 4, half // 4]
    return {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope, "mrope_interleaved": True}


def _media_token_ids(ids: dict[str, int]) -> dict[str, int]:
    """The media placeholders' ids, as the thinker's and the talker's configs name them."""
    return {
        "audio_token_id": ids["<|audio_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
    }


def _thinker_config(
    ids: dict[str, int], hidden_size: int, layers: int, experts: tuple[int, int], rope: dict[str, Any]
) -> dict[str, Any]:
    head_dim = hidden_size // _HEADS
    text = {
        "vocab_size": THINKER_VOCAB,
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "moe_intermediate_size": hidden_size,
        "num_hidden_layers": layers,
        "num_attention_heads": _HEADS,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "num_experts": experts[0],
        "num_experts_per_tok": experts[1],
        "max_position_embeddings": 8192,
        "rope_parameters": rope,
    }
    return {
        "text_config": text,
        "audio_config": _audio_encoder(hidden_size),
        "vision_config": _vision_encoder(hidden_size),
        # The processor's default (it interleaves video and audio by it); the real checkpoint's value.
        "position_id_per_seconds": 13,
        **_media_token_ids(ids),
        "user_token_id": ids["user"],
    }


def _audio_encoder(hidden_size: int) -> dict[str, Any]:
    return {
        "num_mel_bins": MEL_BINS,
        "encoder_layers": 1,
        "encoder_attention_heads": 2,
        "encoder_ffn_dim": 32,
        "d_model": 16,
        "output_dim": hidden_size,
        "downsample_hidden_size": 8,
        # The processor counts placeholders for 100-frame chunks (n_window 50, 13 tokens each).
        "n_window": 50,
        "n_window_infer": 200,
        "conv_chunksize": 16,
    }


def _vision_encoder(hidden_size: int) -> dict[str, Any]:
    return {
        "depth": 1,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_heads": 2,
        "out_hidden_size": hidden_size,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0],
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    }


def _talker_config(
    ids: dict[str, int],
    hidden_size: int,
    layers: int,
    experts: tuple[int, int],
    code_predictor_layers: int,
    rope: dict[str, Any],
) -> dict[str, Any]:
    head_dim = hidden_size // _HEADS
    text = {
        "vocab_size": 3072,
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "moe_intermediate_size": hidden_size,
        "shared_expert_intermediate_size": hidden_size,
        "num_hidden_layers": layers,
        "num_attention_heads": _HEADS,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "num_experts": experts[0],
        "num_experts_per_tok": experts[1],
        "max_position_embeddings": 8192,
        "rope_parameters": rope,
    }
    code_predictor = {
        "vocab_size": 2048,
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "num_hidden_layers": code_predictor_layers,
        "num_attention_heads": _HEADS,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "num_code_groups": 16,
        "max_position_embeddings": 64,
    }
    return {
        "text_config": text,
        "code_predictor_config": code_predictor,
        "num_code_groups": 16,
        "thinker_hidden_size": hidden_size,
        "accept_hidden_layer": layers,
        "codec_eos_token_id": 2150,
        "codec_pad_id": 2148,
        "codec_bos_id": 2149,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303},
        **_media_token_ids(ids),
        "spatial_merge_size": 2,
    }


def _code2wav_config() -> dict[str, Any]:
    return {
        "codebook_size": 2048,
        "num_quantizers": 16,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "sliding_window": 72,
        "decoder_dim": 64,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
    }


def write_processor_config(directory: Path) -> None:
    """The processor files of the real checkpoint's layout (Whisper features and the Qwen2-VL image
    recipe in preprocessor_config.json, the video recipe beside it), sized for the tiny encoders."""
    vision = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "merge_size": MERGE_SIZE,
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    }
    audio = {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": MEL_BINS,
        "sampling_rate": 16000,
        "hop_length": 160,
        "n_fft": 400,
        "chunk_length": 30,
        "n_samples": 480000,
        "nb_max_frames": 3000,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": True,
        "dither": 0.0,
    }
    preprocessor = {**audio, **vision, "image_processor_type": "Qwen2VLImageProcessor"}
    preprocessor["processor_class"] = "Qwen3OmniMoeProcessor"
    video = {**vision, "video_processor_type": "Qwen2VLVideoProcessor", "do_sample_frames": False}
    video["processor_class"] = "Qwen3OmniMoeProcessor"
    (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2, sort_keys=True))
    (directory / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2, sort_keys=True))
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE)


class _ZeroedEmpty(torch.overrides.TorchFunctionMode):
    """transformers leaves some parameters (the talker's MoE experts) as `torch.empty` memory: a
    fresh process's denormal bits, or what an earlier build in the process freed. Under this mode
    that is zeros: a seed makes the same checkpoint byte for byte, however many came before it."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if func is torch.empty:
            func = torch.zeros
        return func(*args, **(kwargs or {}))


def _rescale_code2wav(model: Any, target_rms: float, seed: int) -> None:
    """Random init makes ~1e-6 audio; scale the last conv so the output sits near `target_rms`."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, model.config.code2wav_config.codebook_size, (1, 16, 12), generator=gen)
    last = model.code2wav.decoder[-1].conv
    for _ in range(3):  # the output clamps at +-1, so converge in a few rounds
        with torch.no_grad():
            rms = model.code2wav(codes).pow(2).mean().sqrt().item()
            last.weight.mul_(target_rms / max(rms, 1e-12))
            if last.bias is not None:
                last.bias.zero_()


def make_tiny_model(
    directory: str | Path,
    seed: int = 0,
    hidden_size: int = 64,
    layers: int = 2,
    experts: int = 4,
    code_predictor_layers: int = 1,
    answers_end: bool = True,
    top_k: tuple[int, int] = (2, 2),
) -> Path:
    """Write a deterministic tiny checkpoint (config, safetensors, tokenizer) into `directory`.
    `code_predictor_layers=5`: the real code-predictor depth (the frame's op count grows with it).
    `answers_end=False` keeps the purely random thinker and talker, which run to `max_tokens` /
    `max_audio_frames` (fixed lengths; tiny_answer_end.py)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from omnistream.models.qwen3_omni.tiny_answer_end import make_answers_end

    (directory := Path(directory)).mkdir(parents=True, exist_ok=True)
    ids = build_tokenizer(directory)
    write_processor_config(directory)
    config = tiny_config(
        ids,
        hidden_size=hidden_size,
        layers=layers,
        experts=experts,
        code_predictor_layers=code_predictor_layers,
        top_k=top_k,
    )
    torch.manual_seed(seed)
    with _ZeroedEmpty():
        model = Qwen3OmniMoeForConditionalGeneration(config).eval()  # type: ignore[no-untyped-call]
    _rescale_code2wav(model, target_rms=0.1, seed=seed)
    if answers_end:
        make_answers_end(model, directory, BPE_VOCAB)
    model.save_pretrained(str(directory))
    (directory / "omnistream_tiny.json").write_text(
        json.dumps(
            {
                "seed": seed,
                "hidden_size": hidden_size,
                "layers": layers,
                "experts": experts,
                "code_predictor_layers": code_predictor_layers,
                "top_k": list(top_k),
                "answers_end": answers_end,
                "builder": builder_version(),
            }
        )
    )
    return directory


def built(directory: str | Path, **build: Any) -> Path:
    """The tiny checkpoint `make_tiny_model(directory, **build)` writes, built only when missing or
    from another builder version; one process builds while the others wait for it."""
    with build_lock(directory):
        if not is_current(directory):
            make_tiny_model(directory, **build)
    return Path(directory)


def builder_version() -> str:
    """This builder's fingerprint (its sources: this module, the tokenizer's and the talker
    rewiring's): a tiny checkpoint from another version may lack files the code now reads (e.g. the
    processor configs) or behave otherwise (a talker that never ends), so it is rebuilt, not trusted."""
    digest = hashlib.sha256()
    for name in ("tiny.py", "tiny_tokenizer.py", "tiny_answer_end.py"):
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:12]


def is_current(directory: str | Path) -> bool:
    """Was the tiny checkpoint in `directory` written by this version of the builder?"""
    marker = Path(directory) / "omnistream_tiny.json"
    try:
        return bool(json.loads(marker.read_text()).get("builder") == builder_version())
    except (OSError, ValueError):
        return False
