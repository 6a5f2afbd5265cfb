"""What the thinker engine keeps per request and per step, and what it emits per output."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import xgrammar as xgr

from omnistream.engine.detokenizer import IncrementalDetokenizer
from omnistream.engine.engine import RequestState
from omnistream.engine.prefix_cache import CachedBlock
from omnistream.models.qwen3_omni.thinker.media_item import MediaItem
from omnistream.models.qwen3_omni.thinker.media_prompt import MediaPrompt
from omnistream.models.qwen3_omni.thinker.text import ThinkerOutput  # noqa: F401  (re-exported: what it emits)
from omnistream.models.qwen3_omni.thinker.thinker_media import Encoded, PromptEmbedding, Slice
from omnistream.request.stage_chain import ThinkerParams


@dataclass
class _ThinkerState(RequestState):
    prompt_ids: list[int] = field(default_factory=list)
    params: ThinkerParams = field(default_factory=ThinkerParams)
    generator: torch.Generator | None = None
    seed: int = 0  # its draws' seed (the request's, or one chosen for it): draw n is keyed by (seed, n)
    answered: int = 0  # a resumed request: the tokens of its answer given at the open (its prompt's end)
    generated: list[int] = field(default_factory=list)  # what it generated here
    detok: IncrementalDetokenizer | None = None
    next_token: int | None = None  # sampled, not yet fed back
    text_out: bool = False  # some of its text was put out (the engine hands off the GIL at the first)
    media: MediaPrompt | None = None
    slices: list[Slice] = field(default_factory=list)  # media slices not yet encoded
    encoded: Encoded = field(default_factory=Encoded)
    rope_delta: float = 0.0
    embedding: PromptEmbedding | None = None  # a media prompt's input rows, while it prefills
    prefilled: int = 0  # prompt positions already in the KV cache
    deep_rows: list[torch.Tensor] = field(default_factory=list)  # per prefilled chunk
    spoken: list[int] | None = None  # speech: the given answer's ids, streamed instead of generated
    # Prefix caching (prefix.py): planned at its first step, the reuse waiting for its slot, the
    # positions it took from the cache, what its blocks are keyed by and its prompt's deep rows.
    prefix_planned: bool = False
    reuse: tuple[list[CachedBlock], int] | None = None
    cached_tokens: int = 0
    items: list[MediaItem] = field(default_factory=list)
    prompt_positions: torch.Tensor | None = None  # [3, L] float64, a media prompt's
    prompt_deep: torch.Tensor | None = None
    prompt_store_due: bool = False  # its prompt's blocks are stored after its second token
    prefix_keys: list[bytes] = field(default_factory=list)  # its sequence's block keys computed so far
    # Its output grammar's state (grammar.py), when it has one; dropped when the request ends.
    matcher: xgr.GrammarMatcher | None = None


@dataclass
class _Step:
    encode: list[tuple[_ThinkerState, Slice]]
    prefill: list[tuple[_ThinkerState, int]]  # (request, positions of its prompt this step)
    decode: list[_ThinkerState]
    # Given answers, and work ahead whose windows are encoded: no model work, an output each.
    spoken: list[_ThinkerState] = field(default_factory=list)
    encoded: bool = False  # the encode results are in their states (a later failure keeps them)
    plan: list[_ThinkerState] = field(default_factory=list)  # new requests: their prefix looked up
