"""How many rows the audio encoder makes of an item's mel frames: the processor's count of its
placeholders, needed both where a prompt is built (media_prompt.py) and where its media are cut into
encoder pieces (thinker_media.py, media_item.py)."""

from __future__ import annotations


def audio_tokens(frames: int, n_window: int) -> int:
    """Rows the audio encoder makes of `frames` mel frames (the processor's count)."""
    chunk = n_window * 2
    rest = frames % chunk
    feat = (rest - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * 13
