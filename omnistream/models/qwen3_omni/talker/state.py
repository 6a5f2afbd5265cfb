"""What the talker engine keeps per request, and what it emits per frame."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omnistream.engine.engine import RequestState
from omnistream.engine.playout import Playout
from omnistream.models.qwen3_omni.talker.deep_rows import DeepRows
from omnistream.request.media import MediaLayout
from omnistream.request.stage_chain import TalkerParams


@dataclass
class TalkerOutput:
    codes: list[int] | None  # 16 codes of one frame, or None on a bare end marker
    frame: int
    finished: bool = False
    finish_reason: str | None = None


@dataclass
class _TalkerState(RequestState):
    params: TalkerParams = field(default_factory=TalkerParams)
    speaker_id: int = 0
    generator: torch.Generator | None = None  # codebook 0's draws, keyed by (seed, frame)
    cp_generator: torch.Generator | None = None  # the code predictor's, keyed by (seed, frame, 1)
    seed: int = 0  # the request's, or one chosen for it
    prompt_ids: list[int] | None = None
    multimodal_hidden: DeepRows | None = None
    user_positions: list[int] = field(default_factory=list)  # the prompt's positions in user turns
    media_layout: MediaLayout | None = None  # images/videos: the prompt takes 3-D positions
    rope_delta: float = 0.0
    stream: list[int] = field(default_factory=list)  # the assistant stream: prompt tail + generated
    input_done: bool = False
    spoken_tokens: int = 0  # thinker tokens given to speak (0 at the end: nothing to say, no frames)
    frames: int = 0
    pending_code0: int | None = None
    past_hidden: torch.Tensor | None = None
    next_codec_sum: torch.Tensor | None = None  # codec part of the next talker input
    prefill_done: bool = False  # the whole prompt is in the KV cache (its first code 0 was taken)
    prompt_rows: torch.Tensor | None = None  # [1, rows, H] while the prompt is being prefilled
    prompt_rows_from: int = 0  # the prompt row prompt_rows starts at (those before it came cached)
    prompt_positions: torch.Tensor | None = None  # [3, 1, rows] M-RoPE positions, for prompts with vision
    prefilled: int = 0  # prompt rows already in the KV cache
    # Rows of the whole prompt, known from its ids at the open (before the rows are built): the
    # schedule shares a step's prefill budget among new prompts by it.
    prompt_row_count: int = 0
    # Prefix caching (prefix.py): the user rows' block keys, their last partial block's, their count,
    # and how many of them came from the cache.
    prefix_keys: list[bytes] = field(default_factory=list)
    prefix_tail: bytes | None = None
    prefix_rows: int = 0
    cached_rows: int = 0
    playout: Playout = field(default_factory=lambda: Playout(0.0))  # set on admission
