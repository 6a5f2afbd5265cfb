"""A prompt's media items as prefix caching keys them: where each one's placeholders are, and a
digest of its encoder input.

The digests are taken where the prompt is built (`item_digests`, on the servicer's tokenizer
threads), of the processor's float32 features and pixels on the CPU: equal bytes there are equal
encoder input at any engine dtype, and the engine thread neither hashes nor copies device tensors
back to read them. A conversation re-sends its earlier spoken turns every turn, and the audio
feature cache gives back the very same tensors (audio_features.py): each one's digest is kept while
the tensor lives and is unchanged (its version counter), so twenty turns of audio are hashed once,
not twenty times each. A prompt built without digests has them taken on the engine thread, from its
inputs as they are there, under another tag: the two kinds of digest never meet.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from dataclasses import dataclass

import torch

from omnistream.models.qwen3_omni.thinker.audio_rows import audio_tokens
from omnistream.models.qwen3_omni.thinker.media_prompt import MediaPrompt
from omnistream.models.qwen3_omni.thinker.thinker_media import AUDIO, IMAGE, VIDEO, _grids

KINDS = (AUDIO, IMAGE, VIDEO)


@dataclass
class MediaItem:
    """One media item of a prompt: its placeholder positions' span and its content digest."""

    kind: str
    index: int  # among the prompt's items of this kind
    first: int
    last: int
    digest: bytes


class _TensorDigests:
    """Digests of tensors by identity, while each lives unchanged (weak references; locked: the
    tokenizer threads share it). A digest is kept with the header it was taken under."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[weakref.ref[torch.Tensor], int, bytes, bytes]] = {}
        self._lock = threading.Lock()

    def get(self, tensor: torch.Tensor, header: bytes) -> bytes:
        ident = id(tensor)
        with self._lock:
            kept = self._kept.get(ident)
        if kept is not None and kept[0]() is tensor and kept[1] == tensor._version and kept[2] == header:
            return kept[3]
        digest = _digest(tensor, header)

        def gone(_: weakref.ref[torch.Tensor]) -> None:
            with self._lock:
                if (entry := self._kept.get(ident)) is not None and entry[0]() is None:
                    del self._kept[ident]

        with self._lock:
            self._kept[ident] = (weakref.ref(tensor, gone), tensor._version, header, digest)
        return digest


_AUDIO_DIGESTS = _TensorDigests()


def _digest(data: torch.Tensor, header: bytes) -> bytes:
    digest = hashlib.sha256(header + f"{tuple(data.shape)}\0{data.dtype}\0".encode())
    digest.update(data.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return digest.digest()


def _contents(media: MediaPrompt) -> dict[str, list[torch.Tensor]]:
    """Each item's encoder input, per kind in prompt order (images and videos split by grid)."""
    contents: dict[str, list[torch.Tensor]] = {AUDIO: list(media.audio_features), IMAGE: [], VIDEO: []}
    for kind, pixels, grid in (
        (IMAGE, media.pixel_values, media.image_grid_thw),
        (VIDEO, media.pixel_values_videos, media.video_grid_thw),
    ):
        offset = 0
        for t, h, w in _grids(grid):
            assert pixels is not None
            contents[kind].append(pixels[offset : offset + t * h * w])
            offset += t * h * w
    return contents


def item_digests(media: MediaPrompt, tag: bytes = b"built") -> dict[str, list[bytes]]:
    """Per kind, each item's digest: its encoder input's bytes, dtype and shape, and its grid."""
    out: dict[str, list[bytes]] = {}
    for kind, contents in _contents(media).items():
        grids = _grids(media.image_grid_thw if kind == IMAGE else media.video_grid_thw)
        digests = []
        for index, data in enumerate(contents):
            header = tag + b"\0" + kind.encode() + b"\0"
            if kind == AUDIO:
                digests.append(_AUDIO_DIGESTS.get(data, header))
            else:
                digests.append(_digest(data, header + str(grids[index]).encode() + b"\0"))
        out[kind] = digests
    return out


def media_items(media: MediaPrompt, ids: list[int], config: object) -> list[MediaItem]:
    """Every item's placeholder span (in prompt order per kind) and its digest (`item_digests`,
    taken here if the prompt came without)."""
    tc = config.thinker_config  # type: ignore[attr-defined]
    merge = tc.vision_config.spatial_merge_size
    counts: dict[str, list[int]] = {
        AUDIO: [audio_tokens(int(f.shape[1]), tc.audio_config.n_window) for f in media.audio_features],
        IMAGE: [t * h * w // merge**2 for t, h, w in _grids(media.image_grid_thw)],
        VIDEO: [t * h * w // merge**2 for t, h, w in _grids(media.video_grid_thw)],
    }
    tokens = {AUDIO: tc.audio_token_id, IMAGE: tc.image_token_id, VIDEO: tc.video_token_id}
    digests = media.digests if media.digests is not None else item_digests(media, b"engine")
    items: list[MediaItem] = []
    for kind, token in tokens.items():
        if not counts[kind]:
            continue
        spans = [i for i, t in enumerate(ids) if t == token]
        start = 0
        for index, count in enumerate(counts[kind]):
            positions = spans[start : start + count]
            start += count
            items.append(MediaItem(kind, index, positions[0], positions[-1], digests[kind][index]))
    return sorted(items, key=lambda item: item.first)
