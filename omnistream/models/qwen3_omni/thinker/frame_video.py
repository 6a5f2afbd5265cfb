"""The video half of the Qwen3-Omni processor for frames that are already decoded and sized.

transformers' `Qwen2VLVideoProcessor` (the checkpoint's video processor) exists only on the
torchvision backend, which this project cannot use. Its work on frames that arrive already resized
(the gateway sizes them as the reference's `fetch_video` does, to multiples of patch * merge) is
rescale, normalize and patchify; this does exactly that in numpy, with the same grid layout, and
stands in as the processor's `video_processor`, so the rest (placeholder counts, audio/video
interleaving) is still the real processor's code. A frame size that would need resizing is refused:
resizing is the gateway's job, and doing it here with another library would silently differ.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from transformers.feature_extraction_utils import BatchFeature

CONFIG_NAME = "video_preprocessor_config.json"
FALLBACK_CONFIG_NAME = "preprocessor_config.json"


class FrameVideoProcessor:
    model_input_names: ClassVar[list[str]] = ["pixel_values_videos", "video_grid_thw"]

    def __init__(
        self,
        patch_size: int,
        temporal_patch_size: int,
        merge_size: int,
        image_mean: Sequence[float],
        image_std: Sequence[float],
        rescale_factor: float = 1 / 255,
        **_: Any,
    ) -> None:
        self.patch_size = patch_size
        self.temporal_patch_size = temporal_patch_size
        self.merge_size = merge_size
        # Rescale and normalize fused into one affine map, as the fast processors do.
        self.mean = (np.asarray(image_mean, np.float32) / np.float32(rescale_factor)).astype(np.float32)
        self.std = (np.asarray(image_std, np.float32) / np.float32(rescale_factor)).astype(np.float32)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> FrameVideoProcessor:
        """The checkpoint's video recipe; a checkpoint without one shares the image recipe."""
        path = Path(model_dir) / CONFIG_NAME
        if not path.exists():
            path = Path(model_dir) / FALLBACK_CONFIG_NAME
        return cls(**json.loads(path.read_text()))

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def __call__(self, videos: Any, **_: Any) -> BatchFeature:
        patches, grids = [], []
        for frames in _flatten(videos):
            flat, grid = self.patchify(np.asarray(frames))
            patches.append(flat)
            grids.append(grid)
        return BatchFeature(
            {
                "pixel_values_videos": torch.from_numpy(np.concatenate(patches)),
                "video_grid_thw": torch.tensor(grids, dtype=torch.long),
            }
        )

    def patchify(self, frames: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """uint8 [T, H, W, 3] -> float32 [grid_t * grid_h * grid_w, 3 * tp * p * p] and its grid."""
        t, h, w, c = frames.shape
        if h % self.factor or w % self.factor:
            raise ValueError(f"video frames must be sized to multiples of {self.factor}, got {h}x{w}")
        x = (frames.astype(np.float32) - self.mean) / self.std  # [T, H, W, C]
        x = x.transpose(0, 3, 1, 2)  # [T, C, H, W]
        if pad := -t % self.temporal_patch_size:
            x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
            t += pad
        p, m, tp = self.patch_size, self.merge_size, self.temporal_patch_size
        gt, gh, gw = t // tp, h // p, w // p
        x = x.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
        x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * p * p)), [gt, gh, gw]


def _flatten(videos: Any) -> list[np.ndarray]:
    """The processor hands videos as an array, a list of arrays, or a batch of such lists."""
    if isinstance(videos, np.ndarray) and videos.ndim == 4:
        return [videos]
    out: list[np.ndarray] = []
    for item in videos:
        out.extend(_flatten(item))
    return out
