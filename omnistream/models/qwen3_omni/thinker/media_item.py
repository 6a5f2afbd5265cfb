"""A prompt's media items as prefix caching keys them: where each one's placeholders are, and a
digest of its encoder input (the bytes at the engine's dtype: one engine's keys never mix dtypes)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from omnistream.models.qwen3_omni.thinker.media_prompt import MediaPrompt
from omnistream.models.qwen3_omni.thinker.thinker_media import AUDIO, IMAGE, VIDEO, _grids, audio_tokens


@dataclass
class MediaItem:
    """One media item of a prompt: its placeholder positions' span and its content digest."""

    kind: str
    index: int  # among the prompt's items of this kind
    first: int
    last: int
    digest: bytes


def media_items(media: MediaPrompt, ids: list[int], config: object) -> list[MediaItem]:
    """Every item's placeholder span (in prompt order per kind) and a digest of its encoder input."""
    tc = config.thinker_config  # type: ignore[attr-defined]
    merge = tc.vision_config.spatial_merge_size
    counts: dict[str, list[int]] = {
        AUDIO: [audio_tokens(int(f.shape[1]), tc.audio_config.n_window) for f in media.audio_features],
        IMAGE: [t * h * w // merge**2 for t, h, w in _grids(media.image_grid_thw)],
        VIDEO: [t * h * w // merge**2 for t, h, w in _grids(media.video_grid_thw)],
    }
    tokens = {AUDIO: tc.audio_token_id, IMAGE: tc.image_token_id, VIDEO: tc.video_token_id}
    contents = {AUDIO: list(media.audio_features), IMAGE: [], VIDEO: []}
    for kind, pixels, grid in (
        (IMAGE, media.pixel_values, media.image_grid_thw),
        (VIDEO, media.pixel_values_videos, media.video_grid_thw),
    ):
        offset = 0
        for t, h, w in _grids(grid):
            assert pixels is not None
            contents[kind].append(pixels[offset : offset + t * h * w])
            offset += t * h * w
    items: list[MediaItem] = []
    for kind, token in tokens.items():
        spans = [i for i, t in enumerate(ids) if t == token]
        start = 0
        for index, count in enumerate(counts[kind]):
            positions = spans[start : start + count]
            start += count
            data = contents[kind][index]
            digest = hashlib.sha256(f"{kind}\0{tuple(data.shape)}\0".encode())
            digest.update(data.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
            if kind != AUDIO:
                grids = _grids(media.image_grid_thw if kind == IMAGE else media.video_grid_thw)
                digest.update(str(grids[index]).encode())
            items.append(MediaItem(kind, index, positions[0], positions[-1], digest.digest()))
    return sorted(items, key=lambda item: item.first)
