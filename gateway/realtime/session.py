"""One realtime connection's state: its configuration, its input audio buffer (bounded, rate
checked), and its conversation (bounded history the next turns are built from).

History: the thinker cannot transcribe a user's audio separately, so a user audio turn stays audio
(decoded 16 kHz samples, kept once, not re-decoded) for as long as it is in the history; an
assistant turn is kept as its text (the transcript of what it said, cut to what was heard when it
was interrupted). The history is bounded by items and by user audio seconds; the oldest items go
first, so a long session costs each turn a bounded prompt.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gateway.realtime.events import EventError, Extensions, ServerVad, SessionFields
from gateway.realtime.protocol import Protocol
from gateway.realtime.vad import INPUT_RATE

PCM_FORMAT = {"type": "audio/pcm", "rate": INPUT_RATE}


def _tokens(value: int | str | None) -> int | None:
    return None if value in (None, "inf") else int(value)  # type: ignore[arg-type]


def apply_shared_fields(target: Any, fields: Any) -> None:
    """The fields session.update and response.create share, in either naming scheme (GA or beta),
    onto a session config or one response's settings: only the fields given change."""
    if fields.instructions is not None:
        target.instructions = fields.instructions
    modalities = fields.output_modalities or fields.modalities
    if modalities is not None:
        target.output_modalities = list(dict.fromkeys(modalities))
    audio = fields.audio
    voice = audio.output.voice if audio and audio.output and audio.output.voice else fields.voice
    if voice is not None:
        target.voice = voice
    tokens = (
        fields.max_output_tokens
        if fields.max_output_tokens is not None
        else fields.max_response_output_tokens
    )
    if tokens is not None:
        target.max_output_tokens = _tokens(tokens)
    if fields.temperature is not None:
        target.temperature = fields.temperature


@dataclass
class SessionConfig:
    instructions: str | None = None
    voice: str | None = None  # None: the deployment's default voice
    output_modalities: list[str] = field(default_factory=lambda: ["audio"])
    turn_detection: ServerVad | None = field(default_factory=lambda: ServerVad(type="server_vad"))
    max_output_tokens: int | None = None
    temperature: float | None = None
    extensions: Extensions = field(default_factory=Extensions)

    def apply(self, update: SessionFields) -> None:
        """Apply a session.update (GA or beta fields); only the fields it names change."""
        apply_shared_fields(self, update)
        given, detection = update.turn_detection_given()
        if given:
            self.turn_detection = detection
        if update.omnistream is not None:
            self.extensions = update.omnistream

    @property
    def speaks(self) -> bool:
        return "audio" in self.output_modalities

    def describe(self, protocol: Protocol, session_id: str, model: str, voice: str | None) -> dict[str, Any]:
        """The session object of session.created / session.updated, in the connection's scheme."""
        detection = None if self.turn_detection is None else self.turn_detection.model_dump()
        tokens: int | str = self.max_output_tokens or "inf"
        if protocol.beta:
            return {
                "id": session_id,
                "object": "realtime.session",
                "model": model,
                "modalities": self.output_modalities,
                "instructions": self.instructions or "",
                "voice": voice,
                "input_audio_format": "pcm16",
                "output_audio_format": "pcm16",
                "turn_detection": detection,
                "temperature": self.temperature,
                "max_response_output_tokens": tokens,
            }
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": model,
            "output_modalities": self.output_modalities,
            "instructions": self.instructions or "",
            "audio": {
                "input": {"format": PCM_FORMAT, "turn_detection": detection},
                "output": {"format": PCM_FORMAT, "voice": voice},
            },
            "max_output_tokens": tokens,
        }


class AppendRate:
    """A token bucket in seconds of audio: appends may run ahead of real time by `burst` seconds at
    most (so a client replaying a file is refused rather than flooding the VAD and the buffer)."""

    def __init__(self, burst: float, clock=time.monotonic) -> None:
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._at = clock()

    def take(self, seconds: float) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at))
        self._at = now
        if seconds > self._tokens:
            return False
        self._tokens -= seconds
        return True


class InputBuffer:
    """Uncommitted input audio (pcm16 24 kHz), at most `max_bytes`; `start` is the stream sample
    its first byte is (the VAD's positions are stream samples)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.data = bytearray()
        self.start = 0

    @property
    def end(self) -> int:
        return self.start + len(self.data) // 2

    def append(self, pcm: bytes) -> bool:
        if len(self.data) + len(pcm) > self.max_bytes:
            return False
        self.data += pcm
        return True

    def keep_from(self, sample: int) -> None:
        """Drop audio before `sample` (what a turn that has not started needs no more)."""
        cut = min(max(0, sample - self.start), len(self.data) // 2)
        if cut:
            del self.data[: cut * 2]
            self.start += cut

    def take(self, until: int | None = None) -> bytes:
        """The buffer's audio up to stream sample `until` (all when None); the rest stays."""
        cut = len(self.data) if until is None else min(len(self.data), max(0, until - self.start) * 2)
        out = bytes(self.data[:cut])
        del self.data[:cut]
        self.start += cut // 2
        return out

    def clear(self) -> None:
        self.start = self.end
        self.data.clear()


@dataclass
class Item:
    """A conversation item: `parts` as the thinker takes them (omnistream/request/media.py parts), `content`
    as the client sees it (GA part types)."""

    id: str
    role: str
    parts: list[dict[str, Any]]
    content: list[dict[str, Any]]
    status: str = "completed"
    audio_seconds: float = 0.0  # user audio it holds
    # assistant items
    text: str = ""
    audio_samples_sent: int = 0  # 24 kHz samples handed to the socket
    audio_samples_made: int = 0
    audio_end_ms: int | None = None  # truncated here

    def wire(self, protocol: Protocol) -> dict[str, Any]:
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

    def truncate(self, audio_end_ms: int) -> None:
        """Keep what was heard: the audio to `audio_end_ms`, and the same share of the transcript
        (the text leads the voice, so the share of audio made is the best estimate available)."""
        self.audio_end_ms = audio_end_ms
        made_ms = self.audio_samples_made * 1000 / INPUT_RATE
        if made_ms > 0 and self.text:
            keep = int(len(self.text) * min(1.0, audio_end_ms / made_ms))
            self.text = self.text[:keep]


class Conversation:
    def __init__(self, max_items: int, max_audio_seconds: float) -> None:
        self.max_items = max_items
        self.max_audio_seconds = max_audio_seconds
        self.items: OrderedDict[str, Item] = OrderedDict()

    def add(self, item: Item) -> list[str]:
        """Add `item`; returns the ids of the oldest items dropped to stay within the bounds."""
        if item.id in self.items:
            raise EventError(f"an item with id {item.id!r} exists", code="duplicate_item_id", param="item.id")
        self.items[item.id] = item
        dropped = []
        while len(self.items) > 1 and (
            len(self.items) > self.max_items
            or sum(i.audio_seconds for i in self.items.values()) > self.max_audio_seconds
        ):
            old, _ = self.items.popitem(last=False)
            dropped.append(old)
        return dropped

    def get(self, item_id: str) -> Item:
        item = self.items.get(item_id)
        if item is None:
            raise EventError(
                f"no item {item_id!r} in the conversation", code="item_not_found", param="item_id"
            )
        return item

    def delete(self, item_id: str) -> None:
        self.get(item_id)
        del self.items[item_id]

    def last_id(self) -> str | None:
        return next(reversed(self.items), None)
