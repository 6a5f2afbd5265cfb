"""The parity check compares an answer holding a tool call on the frames before it: the talker does
not speak a call by design, transformers' `generate` speaks every token."""

from __future__ import annotations

from omnistream.bench.gpu_check.parity import _frames_before_call
from omnistream.models.qwen3_omni.checkpoint import load_tokenizer


def test_frames_before_call(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    words = tokenizer.encode("the sea is calm", add_special_tokens=False)
    call = tokenizer.convert_tokens_to_ids("<tool_call>")
    assert _frames_before_call(tokenizer, words) is None  # all spoken: every frame compared
    assert _frames_before_call(tokenizer, [*words, call, *words]) == len(words)
    assert _frames_before_call(None, [*words, call]) is None  # no tokenizer: compared whole
