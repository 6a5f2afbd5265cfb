"""The talker prompt's 3-D positions when the prompt has images or videos.

The reference (`Qwen3OmniMoeForConditionalGeneration.generate`) gives the talker the prompt's
vision grids, and the talker runs `get_rope_index` over its own input ids (the user turns, then the
assistant rows): vision rows take M-RoPE positions, and decoding goes on at position + delta. With
audio only (or text) that is plain positions, which the talker engine uses anyway.

Where the reference cannot run: with audio *and* vision in the prompt, transformers 5.24's talker
reads `talker_config.audio_config`, which does not exist (AttributeError), and `generate` does not
tell the talker `use_audio_in_video`. Here the same function runs with the thinker's audio config in
its place (the one the audio lengths belong to) and with `use_audio_in_video` read off the prompt
(a video's start followed by an audio start); the tests check this against the reference with just
those two gaps filled (tests/media_reference.py).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from typing import Any

import torch

from omnistream.request.media import MediaLayout

ASSISTANT_ROWS = 9  # the talker prompt's assistant part (see prompt.py, TalkerPromptBuilder)


class _WithAudioConfig:
    """The talker model, seen with `config.audio_config` set (see the module docstring)."""

    def __init__(self, talker: Any, audio_config: Any) -> None:
        self._talker = talker
        self.config = copy.copy(talker.config)
        self.config.audio_config = audio_config

    def __getattr__(self, name: str) -> Any:
        return getattr(self._talker, name)


def talker_rope(
    talker: Any, config: Any, user_ids: list[int], layout: MediaLayout | None
) -> tuple[torch.Tensor, float] | None:
    """([3, len(user_ids) + 9] positions, decode delta) for a prompt with vision; None otherwise."""
    if layout is None or not layout.has_vision:
        return None
    tc = config.talker_config
    # The assistant rows hold no media token: any plain id stands for them.
    ids = list(user_ids) + [config.im_start_token_id] * ASSISTANT_ROWS
    pair = (tc.vision_start_token_id, tc.audio_start_token_id)
    interleaved = any(p == pair for p in itertools.pairwise(ids))
    owner = talker
    lengths = None
    if layout.audio_feature_lengths:
        owner = _WithAudioConfig(talker, config.thinker_config.audio_config)
        lengths = torch.tensor(layout.audio_feature_lengths, dtype=torch.long)

    def grid(rows: Sequence[Sequence[int]] | None) -> torch.Tensor | None:
        return torch.tensor(rows, dtype=torch.long) if rows else None

    seconds = torch.tensor(layout.video_second_per_grid) if layout.video_second_per_grid else None
    positions, delta = type(talker).get_rope_index(
        owner,
        torch.tensor([ids]),
        grid(layout.image_grid_thw),
        grid(layout.video_grid_thw),
        torch.ones(1, len(ids), dtype=torch.long),
        interleaved,
        lengths,
        seconds,
    )
    return positions[:, 0].float(), float(delta.reshape(-1)[0])
