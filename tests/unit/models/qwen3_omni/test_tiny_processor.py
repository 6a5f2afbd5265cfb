"""The tiny checkpoint carries the processor's configuration: its special tokens are the config's,
its chat template renders media parts as the real one does, and the processor built from it
expands them."""

from __future__ import annotations

import json
from pathlib import Path

from omnistream.models.qwen3_omni.checkpoint import load_config, load_tokenizer
from omnistream.models.qwen3_omni.thinker.media_prompt import load_processor
from tests.media_samples import image, tone


def test_tokens_template_and_processor_match_the_config(tiny_model_dir):
    config = load_config(tiny_model_dir).thinker_config
    tokenizer = load_tokenizer(tiny_model_dir)
    assert (tokenizer.audio_token_id, tokenizer.image_token_id, tokenizer.video_token_id) == (
        config.audio_token_id,
        config.image_token_id,
        config.video_token_id,
    )
    assert tokenizer.convert_tokens_to_ids(tokenizer.audio_bos_token) == config.audio_start_token_id
    assert tokenizer.convert_tokens_to_ids(tokenizer.vision_bos_token) == config.vision_start_token_id
    messages = [
        {"role": "user", "content": [{"type": "image", "image": image()}, {"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "yes"},
        {"role": "user", "content": [{"type": "audio", "audio": tone(0.5)}]},
    ]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\n"
        "<|im_start|>assistant\nyes<|im_end|>\n"
        "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|><|im_end|>\n<|im_start|>assistant\n"
    )
    processor = load_processor(tiny_model_dir, tokenizer)
    out = processor(
        text=[rendered],
        images=[messages[0]["content"][0]["image"].pixels],
        audio=[messages[2]["content"][0]["audio"].samples],
        return_tensors="pt",
    )
    ids = out["input_ids"][0].tolist()
    assert ids.count(config.image_token_id) == int(out["image_grid_thw"].prod()) // 4
    assert ids.count(config.audio_token_id) > 1
    files = {p.name for p in Path(tiny_model_dir).iterdir()}
    assert {"preprocessor_config.json", "video_preprocessor_config.json", "chat_template.jinja"} <= files
    video = json.loads((Path(tiny_model_dir) / "video_preprocessor_config.json").read_text())
    assert video["patch_size"] == load_config(tiny_model_dir).thinker_config.vision_config.patch_size


def test_frame_video_layout_is_the_image_processors(tiny_model_dir):
    """A still video (the frame repeated over one temporal patch) is patchified exactly as the real
    image processor patchifies that image (it repeats an image over the temporal patch): same grid,
    same patch order, same normalization."""
    import numpy as np

    processor = load_processor(tiny_model_dir, load_tokenizer(tiny_model_dir))
    still = image(16, 24, seed=4).pixels
    want = processor.image_processor(images=[still], return_tensors="pt")
    got = processor.video_processor(videos=[np.stack([still, still])])
    assert got["video_grid_thw"].tolist() == want["image_grid_thw"].tolist() == [[1, 4, 6]]
    np.testing.assert_allclose(
        got["pixel_values_videos"].numpy(), want["pixel_values"].numpy(), rtol=0, atol=1e-5
    )
    odd = processor.video_processor(videos=[np.stack([still] * 3)])  # padded with its last frame
    assert odd["video_grid_thw"].tolist() == [[2, 4, 6]]
