"""The thinker's media work on the engine thread: encoder slices, prompt embedding, deep rows.

Encoding is cut into slices that give the same rows as one whole pass, so a long item never holds
the decode steps of running requests for more than one slice:
- audio at multiples of the encoder's attention window (`n_window_infer` mel frames): chunks of
  `2 * n_window` frames are encoded independently and attention never crosses a window, so a piece
  starting at a window boundary is encoded exactly as inside the whole;
- video at temporal-patch boundaries: the vision encoder attends within one temporal patch and its
  positions depend on height and width only;
- images whole (one image is one attention block).
Slices of several requests run in one encoder call (`encode_slices`): the encoders take packed
inputs with per-item lengths (audio `feature_lens`, vision `grid_thw`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from omnistream.engine.engine import present
from omnistream.models.qwen3_omni.thinker.audio_rows import audio_tokens
from omnistream.models.qwen3_omni.thinker.media_prompt import MediaPrompt
from omnistream.request.errors import InvalidRequest

AUDIO, IMAGE, VIDEO = "audio", "image", "video"


@dataclass
class Slice:
    """One piece of one media item: audio features [mel, n] or vision patches with their grid."""

    kind: str
    item: int  # index of the item among the request's items of this kind
    data: torch.Tensor
    grid: list[int] | None = None  # vision only: [t, h, w] of this piece

    @property
    def cost(self) -> int:
        """Encoder input units (mel frames or patches): what a step's encode budget counts."""
        return int(self.data.shape[1]) if self.kind == AUDIO else int(self.data.shape[0])


def plan_slices(media: MediaPrompt, audio_window: int, vision_budget: int, merge: int) -> list[Slice]:
    """A request's media as encoder slices, in prompt-independent order (audio, images, videos)."""
    slices: list[Slice] = []
    for i, feats in enumerate(media.audio_features):
        for start in range(0, int(feats.shape[1]), audio_window):
            slices.append(Slice(AUDIO, i, feats[:, start : start + audio_window]))
    offset = 0
    for i, grid in enumerate(_grids(media.image_grid_thw)):
        n = grid[0] * grid[1] * grid[2]
        slices.append(Slice(IMAGE, i, present(media.pixel_values)[offset : offset + n], grid))
        offset += n
    offset = 0
    for i, (t, h, w) in enumerate(_grids(media.video_grid_thw)):
        per_t = h * w
        step = max(1, vision_budget // per_t)
        for t0 in range(0, t, step):
            t1 = min(t, t0 + step)
            rows = present(media.pixel_values_videos)[offset + t0 * per_t : offset + t1 * per_t]
            slices.append(Slice(VIDEO, i, rows, [t1 - t0, h, w]))
        offset += t * per_t
    return slices


def _grids(grid: torch.Tensor | None) -> list[list[int]]:
    return [] if grid is None else [list(map(int, g)) for g in grid]


def check_media_prompt(media: MediaPrompt, ids: Sequence[int], config: Any) -> None:
    """Placeholder counts agree with the encoder inputs (before the request joins any batch)."""
    tc = config.thinker_config
    vision = tc.vision_config
    merge = vision.spatial_merge_size
    patch_dim = 3 * vision.temporal_patch_size * vision.patch_size**2
    if media.positions.shape != (3, len(ids)):
        raise InvalidRequest("media positions must be [3, prompt length]", field="messages")
    n_window = tc.audio_config.n_window
    want = sum(audio_tokens(int(f.shape[1]), n_window) for f in media.audio_features)
    for f in media.audio_features:
        if f.dim() != 2 or f.shape[0] != tc.audio_config.num_mel_bins or f.shape[1] == 0:
            raise InvalidRequest("audio features must be [mel bins, frames]", field="messages")
    # Counted in C, the token ids read once: a config attribute is a slow property, and a whole
    # conversation's ids are counted here on the event loop at every turn.
    ids = ids if isinstance(ids, list) else list(ids)
    if ids.count(tc.audio_token_id) != want:
        raise InvalidRequest("audio placeholders do not match the audio", field="messages")
    for kind, pixels, grid, token in (
        (IMAGE, media.pixel_values, media.image_grid_thw, tc.image_token_id),
        (VIDEO, media.pixel_values_videos, media.video_grid_thw, tc.video_token_id),
    ):
        grids = _grids(grid)
        patches = sum(t * h * w for t, h, w in grids)
        if any(h % merge or w % merge or t < 1 for t, h, w in grids):
            raise InvalidRequest(f"{kind} grids must be whole merge blocks", field="messages")
        if patches and (pixels is None or tuple(pixels.shape) != (patches, patch_dim)):
            raise InvalidRequest(f"{kind} pixels do not match their grids", field="messages")
        if ids.count(token) != patches // merge**2:
            raise InvalidRequest(f"{kind} placeholders do not match the {kind}s", field="messages")


@dataclass
class Encoded:
    """Encoder rows of one request, gathered slice by slice (in slice order within each item)."""

    audio: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    vision: dict[tuple[str, int], list[tuple[torch.Tensor, list[torch.Tensor]]]] = field(default_factory=dict)

    def add(self, piece: Slice, rows: torch.Tensor, deep: list[torch.Tensor] | None) -> None:
        if piece.kind == AUDIO:
            self.audio.setdefault(piece.item, []).append(rows)
        else:
            self.vision.setdefault((piece.kind, piece.item), []).append((rows, deep or []))

    def audio_rows(self) -> torch.Tensor | None:
        pieces = [r for i in sorted(self.audio) for r in self.audio[i]]
        return torch.cat(pieces) if pieces else None

    def vision_rows(self, kind: str) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        keys = sorted(k for k in self.vision if k[0] == kind)
        if not keys:
            return None
        pieces = [p for k in keys for p in self.vision[k]]
        rows = torch.cat([p[0] for p in pieces])
        deep = [torch.cat([p[1][d] for p in pieces]) for d in range(len(pieces[0][1]))]
        return rows, deep


def encode_slices(
    model: Any, slices: Sequence[Slice]
) -> list[tuple[torch.Tensor, list[torch.Tensor] | None]]:
    """Run the audio and vision encoders once each over `slices` (of any requests); rows per slice."""
    out: list[tuple[torch.Tensor, list[torch.Tensor] | None] | None] = [None] * len(slices)
    audio = [i for i, s in enumerate(slices) if s.kind == AUDIO]
    if audio:
        tower = model.audio_tower
        lens = [int(slices[i].data.shape[1]) for i in audio]
        feats = torch.cat([slices[i].data for i in audio], dim=1).to(tower.conv2d1.weight.device)
        feature_lens = torch.tensor(lens, device=feats.device)
        rows = tower(input_features=feats, feature_lens=feature_lens).last_hidden_state
        sizes = [audio_tokens(n, tower.n_window) for n in lens]
        for i, part in zip(audio, rows.split(sizes), strict=True):
            out[i] = (part, None)
    vision = [i for i, s in enumerate(slices) if s.kind != AUDIO]
    if vision:
        visual = model.visual
        pixels = torch.cat([slices[i].data for i in vision]).to(visual.device, visual.dtype)
        grid = torch.tensor([slices[i].grid for i in vision], device=pixels.device)
        result = visual(pixels, grid_thw=grid)
        sizes = (grid.prod(-1) // visual.spatial_merge_size**2).tolist()
        rows = result.pooler_output.split(sizes)
        deep = [d.split(sizes) for d in result.deepstack_features]
        for j, i in enumerate(vision):
            out[i] = (rows[j], [d[j] for d in deep])
    return out  # type: ignore[return-value]


@dataclass
class PromptEmbedding:
    """Inputs of a multimodal prefill: embeddings with the media rows in, and the deepstack rows."""

    embeds: torch.Tensor  # [1, L, H]
    visual_mask: torch.Tensor | None  # [1, L] bool
    deepstack: list[torch.Tensor] | None  # per deepstack layer: [visual positions, H]


def embed_prompt(model: Any, ids: torch.Tensor, config: Any, encoded: Encoded) -> PromptEmbedding:
    """The reference's merge (`Qwen3OmniMoeThinkerModel.forward`): encoder rows replace their
    placeholders' embeddings in order; image and video deepstack rows join in position order."""
    tc = config.thinker_config
    embeds = model.get_input_embeddings()(ids)
    audio = encoded.audio_rows()
    if audio is not None:
        mask = (ids == tc.audio_token_id).unsqueeze(-1)
        embeds = embeds.masked_scatter(mask, audio.to(embeds.dtype))
    image, video = encoded.vision_rows(IMAGE), encoded.vision_rows(VIDEO)
    image_mask, video_mask = ids == tc.image_token_id, ids == tc.video_token_id
    for rows, mask in ((image, image_mask), (video, video_mask)):
        if rows is not None:
            embeds = embeds.masked_scatter(mask.unsqueeze(-1), rows[0].to(embeds.dtype))
    if image is None and video is None:
        return PromptEmbedding(embeds, None, None)
    visual_mask = image_mask | video_mask
    layers = len((image or video)[1])  # type: ignore[index]
    deepstack = []
    for d in range(layers):
        joint = embeds.new_zeros(int(visual_mask.sum()), embeds.shape[-1])
        if image is not None:
            joint[image_mask[visual_mask]] = image[1][d].to(embeds.dtype)
        if video is not None:
            joint[video_mask[visual_mask]] = video[1][d].to(embeds.dtype)
        deepstack.append(joint)
    return PromptEmbedding(embeds, visual_mask, deepstack)


class LayerTap:
    """The hidden states the reference reports as `hidden_states[k]` of a forward: k = 0 is the
    input embedding, k = num_layers the final (normed) output, else the output of decoder layer
    k - 1 as recorded (before any deepstack addition)."""

    def __init__(self, lm: Any, k: int) -> None:
        self.lm = lm
        self.k = k
        self.rows: torch.Tensor | None = None
        self._handle: Any = None

    def __enter__(self) -> LayerTap:
        if 0 < self.k < len(self.lm.layers):

            def hook(_module: Any, _inputs: Any, output: Any) -> None:
                self.rows = output[0] if isinstance(output, tuple) else output

            self._handle = self.lm.layers[self.k - 1].register_forward_hook(hook)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()

    def take(self, embeds: torch.Tensor, last_hidden: torch.Tensor) -> torch.Tensor:
        if self.k == 0:
            return embeds
        if self.k >= len(self.lm.layers):
            return last_hidden
        assert self.rows is not None
        return self.rows
