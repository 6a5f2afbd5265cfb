"""Build the embedded tiny Qwen3-Omni checkpoint.

No model hub is reachable where this project is developed and tested, so the default model is a
randomly initialised `Qwen3OmniMoeForConditionalGeneration` with the real architecture shrunk to a few
megabytes, saved in the standard Hugging Face layout next to a byte-level tokenizer whose special
tokens match the config. Everything that loads a real checkpoint loads this one the same way.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from omnistream.models.build_lock import build_lock

# Order matters: the special tokens take the ids right after the BPE vocabulary, in this order.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
]
BPE_VOCAB = 480
THINKER_VOCAB = 512  # BPE_VOCAB + specials, rounded up

# Qwen3's tool tokens, as the real vocabulary has them: added tokens, not special (a call's markup
# decodes into the answer's text, where the gateway's parser finds it). They take the ids after the
# special tokens, so the BPE ids, the special ids and the weights stay those of a build without them.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# ChatML; a content given as parts renders media the way the real Qwen3-Omni template does (one
# placeholder between its start/end tokens, which the processor expands); a string renders as before.
# With `tools`, assistant `tool_calls` and `tool` messages: Qwen3's format, byte for byte (the
# `# Tools` system block with one JSON line per tool inside <tools></tools>, each call as
# `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`, consecutive tool results as one
# user turn of `<tool_response>` blocks). A chat without any of them renders as it always did.
_CONTENT_MACRO = (
    "{% macro render_content(content) %}"
    "{% if content is string %}{{ content }}"
    "{% elif content %}{% for part in content %}"
    "{% if part['type'] == 'audio' %}{{ '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{% elif part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% endmacro %}"
)
_TOOLS_BLOCK = (
    "{% if tools %}"
    "{{ '<|im_start|>system\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ render_content(messages[0]['content']) + '\n\n' }}{% endif %}"
    "{{ '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{\\"name\\": <function-name>, '
    '\\"arguments\\": <args-json-object>}\n</tool_call><|im_end|>\n\' }}'
    "{% endif %}"
)
_TOOL_CALLS = (
    "{% for tool_call in message['tool_calls'] %}"
    "{% if not loop.first or message['content'] %}{{ '\n' }}{% endif %}"
    "{% set call = tool_call['function'] if tool_call['function'] is defined else tool_call %}"
    "{{ '<tool_call>\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}"
    "{% if call['arguments'] is string %}{{ call['arguments'] }}"
    "{% else %}{{ call['arguments'] | tojson }}{% endif %}"
    "{{ '}\n</tool_call>' }}"
    "{% endfor %}"
)
CHAT_TEMPLATE = (
    _CONTENT_MACRO + _TOOLS_BLOCK + "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\n<tool_response>\n' }}{{ render_content(message['content']) }}{{ '\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{{ render_content(message['content']) }}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}" + _TOOL_CALLS + "{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The processor finds placeholders and their frames by these names (the real tokenizer's).
MEDIA_TOKENS = {
    "audio_token": "<|audio_pad|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}
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

_CORPUS_WORDS = (
    "the quick brown fox jumps over the lazy dog while a small bird sings in the morning light "
    "hello world how are you today I am fine thank you please tell me a story about the sea "
    "streaming audio text speech model thinker talker voice sound music answer question system "
    "user assistant you are a helpful assistant what is the weather like it is sunny and warm "
    "numbers one two three four five six seven eight nine ten zero 0 1 2 3 4 5 6 7 8 9 "
    "punctuation , . ! ? ; : ' \" ( ) - caf\u00e9 na\u00efve \u00fcber \u4f60\u597d \U0001f600"
)


def _corpus() -> list[str]:
    turns = [
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
        "<|im_start|>user\nHello, how are you?<|im_end|>\n",
        "<|im_start|>assistant\nI am fine, thank you.<|im_end|>\n",
    ]
    words = _CORPUS_WORDS.split()
    lines = [" ".join(words[i : i + 12]) for i in range(0, len(words), 3)]
    return turns * 50 + lines * 20 + ["system user assistant"] * 100


def build_tokenizer(directory: Path) -> dict[str, int]:
    """Train a deterministic byte-level BPE and save it as a `PreTrainedTokenizerFast` directory."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # The chat roles are single tokens in the real vocabulary; the talker finds turns by them.
    tok.add_tokens(["system", "user", "assistant"])
    # Pad the BPE part to a fixed size so the special ids never move.
    while tok.get_vocab_size() < BPE_VOCAB:
        tok.add_tokens([f"<|unused_{tok.get_vocab_size()}|>"])
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        **MEDIA_TOKENS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    for word in ("system", "user", "assistant"):
        encoded = tok.encode(word).ids
        if len(encoded) != 1:
            raise RuntimeError(f"tiny tokenizer must keep {word!r} as one token, got {encoded}")
        ids[word] = encoded[0]
    return ids


def tiny_config(
    ids: dict[str, int],
    hidden_size: int = 64,
    layers: int = 2,
    experts: int = 4,
    code_predictor_layers: int = 1,
):
    from transformers import Qwen3OmniMoeConfig

    heads = 4
    head_dim = hidden_size // heads
    half = head_dim // 2
    mrope = [half - 2 * (half // 4), half // 4, half // 4]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope, "mrope_interleaved": True}
    text = {
        "vocab_size": THINKER_VOCAB,
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "moe_intermediate_size": hidden_size,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "num_experts": experts,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 8192,
        "rope_parameters": rope,
    }
    thinker = {
        "text_config": text,
        "audio_config": {
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
        },
        "vision_config": {
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
        },
        # The processor's default (it interleaves video and audio by it); the real checkpoint's value.
        "position_id_per_seconds": 13,
        "audio_token_id": ids["<|audio_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "user_token_id": ids["user"],
    }
    talker_text = {
        "vocab_size": 3072,
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "moe_intermediate_size": hidden_size,
        "shared_expert_intermediate_size": hidden_size,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "num_experts": experts,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 8192,
        "rope_parameters": rope,
    }
    talker = {
        "text_config": talker_text,
        "code_predictor_config": {
            "vocab_size": 2048,
            "hidden_size": hidden_size,
            "intermediate_size": hidden_size * 2,
            "num_hidden_layers": code_predictor_layers,
            "num_attention_heads": heads,
            "num_key_value_heads": 2,
            "head_dim": head_dim,
            "num_code_groups": 16,
            "max_position_embeddings": 64,
        },
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
        "audio_token_id": ids["<|audio_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "spatial_merge_size": 2,
    }
    code2wav = {
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
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<tts_pad>"],
        tts_bos_token_id=ids["<tts_text_bos>"],
        tts_eos_token_id=ids["<tts_text_eod>"],
        system_token_id=ids["system"],
        user_token_id=ids["user"],
        assistant_token_id=ids["assistant"],
    )


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

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.empty:
            func = torch.zeros
        return func(*args, **(kwargs or {}))


def _rescale_code2wav(model, target_rms: float, seed: int) -> None:
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
    )
    torch.manual_seed(seed)
    with _ZeroedEmpty():
        model = Qwen3OmniMoeForConditionalGeneration(config).eval()
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
    """This builder's fingerprint (its source and the talker rewiring's): a tiny checkpoint from
    another version may lack files the code now reads (e.g. the processor configs) or behave
    otherwise (a talker that never ends), so it is rebuilt, not trusted."""
    digest = hashlib.sha256()
    for name in ("tiny.py", "tiny_answer_end.py"):
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:12]


def is_current(directory: str | Path) -> bool:
    """Was the tiny checkpoint in `directory` written by this version of the builder?"""
    marker = Path(directory) / "omnistream_tiny.json"
    try:
        return json.loads(marker.read_text()).get("builder") == builder_version()
    except (OSError, ValueError):
        return False
