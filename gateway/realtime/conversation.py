"""One realtime connection's conversation: its items and the history the next turns are built from.

History: the thinker cannot transcribe a user's audio separately, so a user audio turn stays audio
(decoded 16 kHz samples, kept once, not re-decoded) for as long as it is in the history; an
assistant turn is kept as its text (the transcript of what it said, cut to what was heard when it
was interrupted). The history keeps what the thinker's context holds (gateway/realtime/context.py
drops the oldest items before a turn that would not fit). Here it is bounded only by what one stage
message can carry (every turn re-sends it all to the thinker in one ThinkerOpen) and by the
operator's optional caps on items and user audio; past a bound the oldest items go first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from gateway.config import STAGE_MESSAGE_HEADROOM, GatewayConfig
from gateway.realtime.events import EventError
from gateway.realtime.protocol import Protocol
from gateway.realtime.vad import INPUT_RATE
from gateway.realtime.voice_to_voice import SpokenTurn
from omnistream.request.media import AudioInput, ImageInput, VideoInput

FUNCTION_CALL, FUNCTION_CALL_OUTPUT = "function_call", "function_call_output"


@dataclass
class Item:
    """A conversation item: `parts` as the thinker takes them (omnistream/request/media.py parts), `content`
    as the client sees it (GA part types). A function call (`type` function_call, role assistant)
    and a call's result (function_call_output, role tool) have no parts: their `call_id`, `name`,
    `arguments` and `output` (gateway/realtime/function_calls.py)."""

    id: str
    role: str
    parts: list[dict[str, Any]]
    content: list[dict[str, Any]]
    status: str = "completed"
    type: str = "message"
    call_id: str = ""
    name: str = ""
    arguments: str = ""  # JSON text
    output: str = ""
    audio_seconds: float = 0.0  # user audio it holds
    # A committed audio turn: when its speech ended, until the response that answers it takes it
    spoken: SpokenTurn | None = None
    # assistant items
    text: str = ""
    audio_samples_sent: int = 0  # samples of the 24 kHz stream handed to the socket, whatever the format
    audio_samples_made: int = 0
    audio_end_ms: int | None = None  # truncated here
    # Token accounting (gateway/realtime/context.py): the prompt tokens its message took as the
    # thinker counted them (None: not measured, estimated), the tokens the thinker generated for an
    # answer, and a revision that changes whenever what it says changes (a truncation).
    tokens: int | None = None
    generated_tokens: int | None = None
    revision: int = 0

    def wire(self, protocol: Protocol) -> dict[str, Any]:
        base = {"id": self.id, "object": "realtime.item", "type": self.type, "status": self.status}
        if self.type == FUNCTION_CALL:
            return {**base, "call_id": self.call_id, "name": self.name, "arguments": self.arguments}
        if self.type == FUNCTION_CALL_OUTPUT:
            return {**base, "call_id": self.call_id, "output": self.output}
        content = []
        for part in self.content:
            out = dict(part)
            out["type"] = protocol.part_type(part["type"])
            if part["type"] == "output_audio":
                out["transcript"] = self.text
            elif part["type"] == "output_text":
                out["text"] = self.text
            content.append(out)
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "role": self.role,
            "status": self.status,
            "content": content,
        }

    @property
    def call_text(self) -> str:
        """A function item's text in a prompt: the call's name and arguments, or the result."""
        return self.name + self.arguments if self.type == FUNCTION_CALL else self.output

    def truncate(self, audio_end_ms: int) -> None:
        """Keep what was heard: the audio to `audio_end_ms`, and the same share of the transcript
        (the text leads the voice, so the share of audio made is the best estimate available).
        Its measured token count no longer applies: it is estimated again."""
        self.audio_end_ms = audio_end_ms
        made_ms = self.audio_samples_made * 1000 / INPUT_RATE
        if made_ms > 0 and self.text:
            keep = int(len(self.text) * min(1.0, audio_end_ms / made_ms))
            self.text = self.text[:keep]
        self.tokens = None
        self.revision += 1

    @property
    def chars(self) -> int:
        """Characters of text it puts in a prompt (what `max_prompt_chars` counts)."""
        if self.type != "message":
            return len(self.call_text)
        if self.role == "assistant":
            return len(self.text)
        return sum(len(p["text"]) for p in self.parts if p["type"] == "text")

    @property
    def payload_bytes(self) -> int:
        """Bytes it takes in the stage message that carries a prompt to the thinker: its text as
        UTF-8 and its decoded media as they go on the wire (float32 samples, uint8 pixels)."""
        if self.type != "message":
            return utf8_len(self.call_text)
        if self.role == "assistant":
            return utf8_len(self.text)
        return sum(part_bytes(p) for p in self.parts)


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def part_bytes(part: dict[str, Any]) -> int:
    kind = part["type"]
    if kind == "text":
        return utf8_len(part["text"])
    media = part.get(kind)
    if isinstance(media, AudioInput):
        return int(media.samples.size) * 4
    if isinstance(media, ImageInput):
        return int(media.pixels.size)
    if isinstance(media, VideoInput):
        audio = media.audio.samples.size * 4 if media.audio is not None else 0
        return int(media.frames.size + audio)
    return 0  # still encoded: not in a conversation (items are decoded before they are added)


@dataclass(frozen=True)
class HistoryLimits:
    """What a conversation may hold whatever the context: what one stage message carries to the
    thinker (`max_bytes` of text and decoded media, `max_chars` of text: the gateway's
    max_prompt_chars), and the operator's optional caps (None: none)."""

    max_bytes: int
    max_chars: int
    max_items: int | None = None
    max_audio_seconds: float | None = None

    @classmethod
    def of(cls, config: GatewayConfig) -> HistoryLimits:
        return cls(
            config.max_message_bytes - STAGE_MESSAGE_HEADROOM,
            config.max_prompt_chars,
            config.realtime_max_history_items,
            config.realtime_history_audio_seconds,
        )

    @classmethod
    def unbounded(cls) -> HistoryLimits:
        return cls(max_bytes=2**62, max_chars=2**62)


@dataclass
class Totals:
    """What a conversation holds, as `HistoryLimits` counts it."""

    bytes: int = 0
    chars: int = 0
    items: int = 0
    audio_seconds: float = 0.0

    def add(self, item: Item, sign: int = 1) -> None:
        self.bytes += sign * item.payload_bytes
        self.chars += sign * item.chars
        self.items += sign
        self.audio_seconds += sign * item.audio_seconds

    def over(self, limits: HistoryLimits, hard: bool = False) -> str | None:
        """The first bound these totals are past (a reason for the logs and metrics), or None;
        `hard`: only what a stage message can carry, not the operator's caps."""
        if self.bytes > limits.max_bytes:
            return "message_size"
        if self.chars > limits.max_chars:
            return "prompt_chars"
        if hard:
            return None
        if limits.max_items is not None and self.items > limits.max_items:
            return "max_items"
        if limits.max_audio_seconds is not None and self.audio_seconds > limits.max_audio_seconds + 1e-9:
            return "audio_seconds"
        return None


class Conversation:
    def __init__(self, limits: HistoryLimits | None = None) -> None:
        self.limits = limits if limits is not None else HistoryLimits.unbounded()
        self.items: OrderedDict[str, Item] = OrderedDict()
        # The system message's text the thinker last counted, and its tokens (context.py).
        self.system_tokens: tuple[str, int] | None = None

    def totals(self, extra_text: str = "") -> Totals:
        """What the history holds, with `extra_text` (the instructions) in the same message."""
        totals = Totals(bytes=utf8_len(extra_text), chars=len(extra_text))
        for item in self.items.values():
            totals.add(item)
        return totals

    def droppable(self, keep: Item | None = None) -> list[Item]:
        """The items that may be dropped, oldest first: those before the newest user item (never
        it, nor what follows it), except system items (they are instructions) and `keep`."""
        items = list(self.items.values())
        newest_user = max((i for i, item in enumerate(items) if item.role == "user"), default=0)
        return [item for item in items[:newest_user] if item.role != "system" and item is not keep]

    def add(self, item: Item) -> list[tuple[str, str]]:
        """Add `item`; returns (id, reason) of the oldest items dropped to stay within the limits."""
        if item.id in self.items:
            raise EventError(f"an item with id {item.id!r} exists", code="duplicate_item_id", param="item.id")
        self.items[item.id] = item
        totals = self.totals()
        dropped = []
        for old in self.droppable(keep=item):
            reason = totals.over(self.limits)
            if reason is None:
                break
            self.remove(old)
            totals.add(old, -1)
            dropped.append((old.id, reason))
        return dropped

    def get(self, item_id: str) -> Item:
        item = self.items.get(item_id)
        if item is None:
            raise EventError(
                f"no item {item_id!r} in the conversation", code="item_not_found", param="item_id"
            )
        return item

    def remove(self, item: Item) -> None:
        """Drop `item` for good (its tokens go with it; a measured prompt it was in is no longer
        the history's: context.measure checks)."""
        del self.items[item.id]

    def delete(self, item_id: str) -> None:
        self.remove(self.get(item_id))

    def last_id(self) -> str | None:
        return next(reversed(self.items), None)
