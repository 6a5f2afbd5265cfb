"""Media as the client API gives them, before decoding: data URLs, base64, raw bytes, allowed URLs.

REST (OpenAI's `input_audio` and `image_url`, vLLM's `audio_url` and `video_url`) and the gRPC API
(`ContentPart.media`) both map a media part to an `EncodedMedia`, which stands in the message's
parts (`{"type": "audio", "audio": EncodedMedia(...)}`) until `gateway.media.decode_pool` replaces it
with the decoded `omnistream.request.media` object. Only cheap, syntactic checks happen here, on the event
loop: the data URL's form, the MIME type's kind, the URL's scheme and prefix, a size estimate.
Base64 decoding and everything heavier runs in the decoder's worker threads.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from omnistream.request.errors import InvalidRequest
from omnistream.request.media import MEDIA_TYPES

# OpenAI's `input_audio.format` -> MIME type (gateway.media.file_decode knows the demuxer of each).
INPUT_AUDIO_FORMATS = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "ogg": "audio/ogg",
    "opus": "audio/ogg",
    "flac": "audio/flac",
    "webm": "audio/webm",
    "m4a": "audio/mp4",
    "mp4": "audio/mp4",
    "aac": "audio/aac",
}
URL_SCHEMES = ("http", "https", "file")


@dataclass(frozen=True, eq=False)
class EncodedMedia:
    """One media item as its client sent it; exactly one of `data`, `base64`, `url` is set.

    `field` is where it came from (e.g. messages.0.content.1.input_audio.data): every error about
    it names that field. `mime` may be empty: the decoder then sniffs the format.
    """

    kind: str
    mime: str
    field: str
    data: bytes | None = None
    base64: str | None = None
    url: str | None = None

    def encoded_size(self) -> int:
        """Bytes of the file (an upper bound for base64; unknown, 0, for a URL not fetched yet)."""
        if self.data is not None:
            return len(self.data)
        if self.base64 is not None:
            return len(self.base64) * 3 // 4
        return 0


def _mime_of_kind(mime: str, kind: str, field: str) -> str:
    mime = mime.strip().lower()
    if mime and mime.split("/", 1)[0] != kind:
        raise InvalidRequest(f"a {kind} part needs a {kind}/* MIME type, not {mime!r}", field=field)
    return mime


def from_data_url(url: str, kind: str, field: str) -> EncodedMedia:
    """`data:<kind>/<subtype>[;param...];base64,<data>` (the payload is decoded later, off the loop)."""
    header, comma, payload = url[len("data:") :].partition(",")
    if not comma:
        raise InvalidRequest("the data URL has no ',' before its data", field=field)
    params = [p.strip().lower() for p in header.split(";")]
    if "base64" not in params[1:]:
        raise InvalidRequest("the data URL must be base64 (data:<type>;base64,<data>)", field=field)
    mime = _mime_of_kind(params[0], kind, field)
    return EncodedMedia(kind, mime, field, base64=payload)


def _allowed(url: str, prefixes: tuple[str, ...]) -> bool:
    """`url` starts with an allowed prefix and cannot step outside it (no dot segments, no
    user-info that would make the prefix's host a user name)."""
    parts = urlsplit(url)
    path = unquote(parts.path)
    if "@" in parts.netloc or any(s in (".", "..") for s in path.split("/")):
        return False
    if parts.scheme == "file" and posixpath.normpath(path) != path.rstrip("/") and path != "/":
        return False
    return any(url.startswith(prefix) for prefix in prefixes)


def from_url(url: str, kind: str, field: str, url_prefixes: tuple[str, ...]) -> EncodedMedia:
    """A `data:` URL, or an http(s)/file URL under one of the operator's `url_prefixes`."""
    if url[:5].lower() == "data:":
        return from_data_url(url, kind, field)
    scheme = urlsplit(url).scheme.lower()
    if scheme not in URL_SCHEMES:
        raise InvalidRequest(
            f"unsupported URL scheme {scheme or url[:16]!r}: give a data: URL (data:{kind}/...;base64,...)",
            field=field,
        )
    if not url_prefixes:
        raise InvalidRequest(
            f"{scheme}: URLs are not accepted by this gateway; send the file as a data: URL", field=field
        )
    if not _allowed(url, url_prefixes):
        raise InvalidRequest(f"the URL is not under a prefix this gateway allows ({scheme}:)", field=field)
    return EncodedMedia(kind, "", field, url=url)


def from_input_audio(data: str, fmt: str, field: str) -> EncodedMedia:
    """OpenAI's `input_audio`: base64 `data` (`field`) in `format` (named by `field`'s sibling)."""
    mime = INPUT_AUDIO_FORMATS.get(fmt.lower())
    if mime is None:
        raise InvalidRequest(
            f"unsupported audio format {fmt!r}; supported: {', '.join(INPUT_AUDIO_FORMATS)}",
            field=field.rsplit(".", 1)[0] + ".format",
        )
    return EncodedMedia("audio", mime, field, base64=data)


def from_bytes(kind: str, mime: str, data: bytes, field: str) -> EncodedMedia:
    """The gRPC API's `EncodedMedia` (the file's bytes and its MIME type)."""
    if kind not in MEDIA_TYPES:
        raise InvalidRequest(f"media kind must be one of {MEDIA_TYPES}, not {kind!r}", field=field + ".kind")
    return EncodedMedia(kind, _mime_of_kind(mime, kind, field + ".mime_type"), field + ".data", data=data)


def pending(messages: list[dict[str, Any]] | None) -> list[tuple[dict[str, Any], EncodedMedia]]:
    """Every part of `messages` that still holds an `EncodedMedia`, with that part."""
    found = []
    for message in messages or ():
        content = message["content"]
        if isinstance(content, str):
            continue
        for part in content:
            item = part.get(part["type"])
            if isinstance(item, EncodedMedia):
                found.append((part, item))
    return found
