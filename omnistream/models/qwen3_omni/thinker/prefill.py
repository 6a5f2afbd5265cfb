"""A thinker prompt's prefill, one piece a step: plain ids, or media rows at M-RoPE positions.

A mixin of `ThinkerEngine`: the scheduler (`_schedule`) decides how many positions a request takes
this step; these methods run that piece through the engine's `_forward`, and `prefilled` advances
only once the forward has run (a failed piece leaves nothing behind).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from omnistream.models.qwen3_omni.thinker.state import _ThinkerState
from omnistream.models.qwen3_omni.thinker.thinker_media import (
    Encoded,
    LayerTap,
    PromptEmbedding,
    embed_prompt,
)


class PromptPrefill:
    """The prefill half of `ThinkerEngine`."""

    thinker: Any
    lm: Any
    config: Any
    device: Any
    accept_layer: int
    multimodal_ids: set[int]

    def _prefill_piece(
        self, state: _ThinkerState, take: int
    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The next `take` positions of a prompt into the KV cache. After the last piece: (logits
        [1, V] of the last position, deep rows [multimodal positions, H] for a prompt with media, else None);
        before it, None. `prefilled` advances only once the piece's forward has run."""
        start = state.prefilled
        end = min(len(state.prompt_ids), start + take)
        if state.media is None:
            ids = torch.tensor([state.prompt_ids[start:end]], dtype=torch.long, device=self.device)
            logits, _ = self._forward([state], ids)
            state.prefilled = end
            return (logits, None) if end == len(state.prompt_ids) else None
        return self._prefill_media_chunk(state, start, end)

    def _prefill_media_chunk(
        self, state: _ThinkerState, start: int, end: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Positions [start, end) of a prompt with media (its encoder rows in, at its M-RoPE
        positions). Keeps the deep rows of its multimodal positions (what the talker reads there).
        After the last chunk: (logits, deep rows [multimodal positions, H]); before it, None."""
        assert state.media is not None
        if state.embedding is None:
            ids = torch.tensor([state.prompt_ids], dtype=torch.long, device=self.device)
            state.embedding = embed_prompt(self.thinker.model, ids, self.config, state.encoded)
            state.encoded = Encoded()  # the rows are in the embedding now, the inputs are spent
            state.media = dataclasses.replace(
                state.media, audio_features=[], pixel_values=None, pixel_values_videos=None
            )
        whole = state.embedding
        chunk = PromptEmbedding(whole.embeds[:, start:end], None, None)
        if whole.visual_mask is not None and whole.deepstack is not None:
            before = int(whole.visual_mask[0, :start].sum())
            count = int(whole.visual_mask[0, start:end].sum())
            if count:
                rows = [layer[before : before + count] for layer in whole.deepstack]
                chunk = PromptEmbedding(chunk.embeds, whole.visual_mask[:, start:end], rows)
        positions = state.media.positions[:, start:end].to(self.device).unsqueeze(1)  # [3, 1, q]
        with LayerTap(self.lm, self.accept_layer) as tap:
            logits, last = self._forward([state], None, chunk, positions)
        hidden = tap.take(chunk.embeds, last)[0]
        mm = [i for i in range(start, end) if state.prompt_ids[i] in self.multimodal_ids]
        state.deep_rows.append(hidden[[i - start for i in mm]].detach().clone())
        state.prefilled = end
        if end < len(state.prompt_ids):
            return None
        return logits, torch.cat(state.deep_rows)
