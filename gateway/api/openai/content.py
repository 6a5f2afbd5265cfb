"""The REST API's message content: a string, or a list of parts (OpenAI's `text`, `input_audio`,
`image_url`; vLLM's `audio_url`, `video_url`).

A tagged union on `type`, so a bad part is reported against the one form it was meant as; the tags
("<input_audio>", ...) are left out of `param` by gateway/api/openai/errors.py (`UNION_TAGS`), which
names fields as their JSON path (messages.0.content.1.input_audio.data).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from gateway.media.parts import from_input_audio, from_url

STRICT = ConfigDict(extra="forbid", strict=True)


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class InputAudio(BaseModel):
    model_config = STRICT
    data: str = Field(description="The audio file, base64.")
    format: str = Field(description="wav, mp3, ogg, opus, flac, webm, m4a, mp4 or aac.")


class InputAudioPart(BaseModel):
    model_config = STRICT
    type: Literal["input_audio"]
    input_audio: InputAudio


class ImageUrl(BaseModel):
    model_config = STRICT
    url: str = Field(description="data:image/...;base64,... (http(s)/file only where the gateway allows).")
    detail: Literal["auto", "low", "high"] | None = Field(None, description="Accepted and ignored.")


class ImageUrlPart(BaseModel):
    model_config = STRICT
    type: Literal["image_url"]
    image_url: ImageUrl


class MediaUrl(BaseModel):
    model_config = STRICT
    url: str = Field(description="A data: URL (http(s)/file only where the gateway allows).")


class AudioUrlPart(BaseModel):
    """Extension (vLLM): audio by URL."""

    model_config = STRICT
    type: Literal["audio_url"]
    audio_url: MediaUrl


class VideoUrlPart(BaseModel):
    """Extension (vLLM): video by URL; its sound is heard with use_audio_in_video."""

    model_config = STRICT
    type: Literal["video_url"]
    video_url: MediaUrl


PART_TYPES = ("text", "input_audio", "image_url", "audio_url", "video_url")
PART_TAGS = frozenset(f"<{t}>" for t in (*PART_TYPES, "unknown"))


class UnknownPart(BaseModel):
    """What an object with a missing or unknown `type` is checked as: it always fails, on `type`,
    so the error names messages.N.content.M.type and lists the types there are."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["text", "input_audio", "image_url", "audio_url", "video_url"]


def tag_by(key: str, known: tuple[str, ...]) -> Callable[[Any], str | None]:
    """A discriminator on `key`: "<value>" for a known value, "<unknown>" for an object with a
    missing or other one (checked by the union's always-failing member, which names `key`)."""

    def tag(value: Any) -> str | None:
        if not isinstance(value, dict):
            found = getattr(value, key, None)  # an already-built model
            return f"<{found}>" if found in known else None
        found = value.get(key)
        return f"<{found}>" if found in known else "<unknown>"

    return tag


Part = Annotated[
    Annotated[TextPart, Tag("<text>")]
    | Annotated[InputAudioPart, Tag("<input_audio>")]
    | Annotated[ImageUrlPart, Tag("<image_url>")]
    | Annotated[AudioUrlPart, Tag("<audio_url>")]
    | Annotated[VideoUrlPart, Tag("<video_url>")]
    | Annotated[UnknownPart, Tag("<unknown>")],
    Discriminator(
        tag_by("type", PART_TYPES),
        custom_error_type="part_type",
        custom_error_message=f"Input should be a content part with type one of {', '.join(PART_TYPES)}",
    ),
]


def _content_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "<string>"
    return "<parts>" if isinstance(value, list) else None


# The same for the content itself: a string or a list of parts.
Content = Annotated[
    Annotated[str, Tag("<string>")] | Annotated[list[Part], Tag("<parts>")],
    Discriminator(
        _content_kind,
        custom_error_type="content_type",
        custom_error_message="Input should be a string or a list of content parts",
    ),
]


def to_content(
    content: str | list[Any], index: int, url_prefixes: tuple[str, ...]
) -> str | list[dict[str, Any]]:
    """A message's content for `RequestInput`: text only stays one string (exactly as before media
    existed); with media, the parts in order, each media one an `EncodedMedia` to decode."""
    if isinstance(content, str):
        return content
    if not any(not isinstance(p, TextPart) for p in content):
        return "".join(p.text for p in content)
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        at = f"messages.{index}.content.{i}"
        if isinstance(part, TextPart):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, InputAudioPart):
            media = from_input_audio(part.input_audio.data, part.input_audio.format, f"{at}.input_audio.data")
            parts.append({"type": "audio", "audio": media})
        elif isinstance(part, ImageUrlPart):
            media = from_url(part.image_url.url, "image", f"{at}.image_url.url", url_prefixes)
            parts.append({"type": "image", "image": media})
        elif isinstance(part, AudioUrlPart):
            media = from_url(part.audio_url.url, "audio", f"{at}.audio_url.url", url_prefixes)
            parts.append({"type": "audio", "audio": media})
        elif isinstance(part, VideoUrlPart):
            media = from_url(part.video_url.url, "video", f"{at}.video_url.url", url_prefixes)
            parts.append({"type": "video", "video": media})
        else:  # pragma: no cover  (UnknownPart never validates)
            raise AssertionError(f"unexpected part {type(part).__name__}")
    return parts
