"""The random dataset of `vllm bench serve`, made exact: every prompt has exactly `input_len` ids.

Prompts are given as token ids (the gRPC API and the in-process pipeline take ids), wrapped in
Qwen3-Omni's ChatML turns (its special-token ids from the config) so the talker finds its user and
assistant turns; hence a family member, reached as `family.random_prompts`.
"""

from __future__ import annotations

import random
from typing import Any


def random_prompts(config: Any, tokenizer: Any, count: int, input_len: int, seed: int = 0) -> list[list[int]]:
    im_start, im_end = config.im_start_token_id, config.im_end_token_id
    newline = tokenizer.encode("\n", add_special_tokens=False)
    if len(newline) != 1:
        raise ValueError("expected a single newline token")
    nl = newline[0]
    head = [im_start, config.user_token_id, nl]
    tail = [im_end, nl, im_start, config.assistant_token_id, nl]
    body_len = input_len - len(head) - len(tail)
    if body_len < 1:
        raise ValueError(f"input_len must be at least {len(head) + len(tail) + 1}")
    special = set(tokenizer.all_special_ids) | {
        config.user_token_id,
        config.assistant_token_id,
        config.system_token_id,
    }
    vocab = [
        i
        for i in range(min(len(tokenizer), config.thinker_config.text_config.vocab_size))
        if i not in special
    ]
    rng = random.Random(seed)
    return [head + [rng.choice(vocab) for _ in range(body_len)] + tail for _ in range(count)]
