"""A thinker prompt's prefill, one piece a step: plain ids, or media rows at M-RoPE positions.

`PromptPrefill` is a part `ThinkerEngine` holds: the engine's scheduler decides how many positions a
request takes this step; `piece` runs that piece through the forward it was given (the engine's
`forward`, through `ThinkerForward`), and `prefilled` advances only once the forward has run (a failed
piece leaves nothing behind). Its inputs are named in the constructor: the forward, the modules a
media prompt's embedding and deep rows come from, and the model's facts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from omnistream.models.qwen3_omni.thinker.state import _ThinkerState
from omnistream.models.qwen3_omni.thinker.thinker_media import (
    Encoded,
    LayerTap,
    PromptEmbedding,
    embed_prompt,
)


class ThinkerForward(Protocol):
    """The batched text-model forward the prefill runs its pieces through (`ThinkerEngine.forward`)."""

    def forward(
        self,
        states: Sequence[_ThinkerState],
        ids: torch.Tensor | None,
        embedding: PromptEmbedding | None = None,
        positions: torch.Tensor | None = None,
        commit: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class PromptPrefill:
    """A prompt's prefill pieces: plain ids, or media rows at their M-RoPE positions."""

    def __init__(
        self,
        *,
        model: ThinkerForward,
        thinker_model: Any,
        language_model: Any,
        config: Any,
        device: str | torch.device,
        accept_layer: int,
        multimodal_ids: set[int],
    ) -> None:
        self.model = model
        # transformers modules (untyped): the multimodal model a media prompt is embedded with, and its
        # language model, whose layer `accept_layer` gives the deep rows the talker reads.
        self.thinker_model = thinker_model
        self.language_model = language_model
        self.config = config  # the checkpoint's configuration (vision and audio token ids)
        self.device = device
        self.accept_layer = accept_layer
        self.multimodal_ids = multimodal_ids

    def piece(self, state: _ThinkerState, take: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The next `take` positions of a prompt into the KV cache. After the last piece: (logits
        [1, V] of the last position, deep rows [multimodal positions, H] for a prompt with media, else None);
        before it, None. `prefilled` advances only once the piece's forward has run."""
        start = state.prefilled
        end = min(len(state.prompt_ids), start + take)
        if state.media is None:
            ids = torch.tensor([state.prompt_ids[start:end]], dtype=torch.long, device=self.device)
            logits, _ = self.model.forward([state], ids)
            state.prefilled = end
            return (logits, None) if end == len(state.prompt_ids) else None
        return self.media_chunk(state, start, end)

    def media_chunk(
        self, state: _ThinkerState, start: int, end: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Positions [start, end) of a prompt with media (its encoder rows in, at its M-RoPE
        positions). Keeps the deep rows of its multimodal positions (what the talker reads there).
        After the last chunk: (logits, deep rows [multimodal positions, H]); before it, None."""
        assert state.media is not None
        # The embedding starts where a reused prefix ends (prefix.py): the media inside it was not
        # encoded again, and the rows of the media after it are in order.
        offset = state.cached_tokens
        if state.embedding is None:
            ids = torch.tensor([state.prompt_ids[offset:]], dtype=torch.long, device=self.device)
            state.embedding = embed_prompt(self.thinker_model, ids, self.config, state.encoded)
            state.encoded = Encoded()  # the rows are in the embedding now, the inputs are spent
            state.media = dataclasses.replace(
                state.media, audio_features=[], pixel_values=None, pixel_values_videos=None
            )
        whole = state.embedding
        lo, hi = start - offset, end - offset
        chunk = PromptEmbedding(whole.embeds[:, lo:hi], None, None)
        if whole.visual_mask is not None and whole.deepstack is not None:
            before = int(whole.visual_mask[0, :lo].sum())
            count = int(whole.visual_mask[0, lo:hi].sum())
            if count:
                rows = [layer[before : before + count] for layer in whole.deepstack]
                chunk = PromptEmbedding(chunk.embeds, whole.visual_mask[:, lo:hi], rows)
        positions = state.media.positions[:, start:end].to(self.device).unsqueeze(1)  # [3, 1, q]
        with LayerTap(self.language_model, self.accept_layer) as tap:
            logits, last = self.model.forward([state], None, chunk, positions)
        hidden = tap.take(chunk.embeds, last)[0]
        mm = [i for i in range(start, end) if state.prompt_ids[i] in self.multimodal_ids]
        state.deep_rows.append(hidden[[i - start for i in mm]].detach().clone())
        state.prefilled = end
        if end < len(state.prompt_ids):
            return None
        return logits, torch.cat(state.deep_rows)
