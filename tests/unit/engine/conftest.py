"""The tiny model's tokenizer and its chat encoder, for the tests of chat encoding and its memo."""

from __future__ import annotations

import pytest

from omnistream.engine.chat_encoding import ChatEncoder
from omnistream.models.qwen3_omni.checkpoint import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def encoder(tokenizer):
    return ChatEncoder(tokenizer, max_prompt_tokens=4096)
