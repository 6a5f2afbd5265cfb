"""Media files from the command line: the `--audio/--image/--video FILE` flags that `omnistream
chat` (a gateway client) and `omnistream generate` (the in-process pipeline) both take, and the
user turn they make. One definition, so the two commands accept the same files the same way.

`generate` has no gateway in front of it, so it decodes the files with the gateway's own decoder
(`gateway.media.decode_pool`, with the gateway's default limits): a file `generate` takes is a file
the gateway takes, and it reaches the thinker as the same arrays.
"""

from __future__ import annotations

import argparse
from typing import Any

MEDIA_FLAGS = ("audio", "image", "video")


def add_media_args(p: argparse.ArgumentParser) -> None:
    for kind in MEDIA_FLAGS:
        p.add_argument(f"--{kind}", action="append", default=[], help=f"attach a {kind} file (repeatable)")


def media_parts(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The files the flags name, as client media parts ({"type", "data", "mime_type"}), in flag
    order by kind: audio, then images, then videos."""
    from omnistream.client import media

    return [media(path, kind) for kind in MEDIA_FLAGS for path in getattr(args, kind)]


def user_content(text: str, parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A user turn's content: the text alone, or the media parts followed by the text."""
    return [*parts, {"type": "text", "text": text}] if parts else text


def encoded_parts(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Client media parts as the gateway holds them before decoding (`EncodedMedia`), field names
    as the gRPC API would report them."""
    from gateway.media.parts import from_bytes

    out: list[dict[str, Any]] = []
    for part in parts:
        kind = part["type"]
        if kind == "text":
            out.append(part)
            continue
        field = f"--{kind}[{sum(p['type'] == kind for p in out)}]"  # the n-th file of its flag
        out.append({"type": kind, kind: from_bytes(kind, part["mime_type"], part["data"], field)})
    return out


async def decode_media(messages: list[dict[str, Any]] | None, use_audio_in_video: bool) -> None:
    """Decode every encoded media part of `messages` in place, as the gateway does (its limits)."""
    from gateway.media.decode_pool import MediaDecoder
    from gateway.media.limits import MediaLimits

    decoder = MediaDecoder(MediaLimits())
    try:
        await decoder.decode(messages, use_audio_in_video)
    finally:
        decoder.close()
