"""What each stage hands the next, in one shape whatever carries it (gRPC or the engines in-process).

Tensor-typed fields are `Any`: a gRPC link fills them only where the gateway itself needs them, and
keeps the message it read in `wire`, so the next gRPC link forwards the stage's bytes as they came
(no decoding and re-encoding of deep rows or codes on the gateway). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ThinkerOut:
    """One piece of the thinker's output: its tokens, and what of them the talker speaks."""

    token_ids: list[int]
    text_delta: str
    finished: bool = False
    finish_reason: str = ""
    spoken: list[int] | None = None  # the tokens to speak (never a tool call); None: all of them
    prompt_ids: list[int] | None = None  # the first piece: the prompt the thinker ran
    cached_tokens: int = 0  # the first piece: prompt tokens the prefix cache served
    multimodal_positions: list[int] | None = None  # the first piece of a prompt with media
    prompt_hidden: Any = None  # [len(multimodal_positions), H] deep rows at those positions
    media_layout: Any = None  # the first piece of a prompt with images or video
    wire: Any = None  # the message it came in (gRPC): forwarded as it is


@dataclass
class CodecOut:
    """Codec frames the talker shipped: one window's worth (the chunk plan's), or the end."""

    first_frame: int
    frames: int
    finished: bool = False
    finish_reason: str = ""
    codes: Any = None  # [codebooks, frames]; None where the carrier did not decode them
    wire: Any = None


@dataclass
class AudioOut:
    """Samples Code2Wav decoded (float32), and where they start in the answer's audio."""

    audio: Any
    first_sample: int
    sample_rate: int
    finished: bool = False
