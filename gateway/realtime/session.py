"""One realtime connection's state: its configuration, its input audio buffer (bounded, rate
checked), and its conversation (the history the next turns are built from).

History: the thinker cannot transcribe a user's audio separately, so a user audio turn stays audio
(decoded 16 kHz samples, kept once, not re-decoded) for as long as it is in the history; an
assistant turn is kept as its text (the transcript of what it said, cut to what was heard when it
was interrupted). The history keeps what the thinker's context holds (gateway/realtime/context.py
drops the oldest items before a turn that would not fit). Here it is bounded only by what one stage
message can carry (every turn re-sends it all to the thinker in one ThinkerOpen) and by the
operator's optional caps on items and user audio; past a bound the oldest items go first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gateway.api.openai.voices import known
from gateway.config import STAGE_MESSAGE_HEADROOM, GatewayConfig
from gateway.realtime.events import (
    EventError,
    Extensions,
    InputTranscription,
    SessionFields,
    TurnDetection,
    VoiceRef,
)
from gateway.realtime.formats import FORMATS, PCM16, AudioFormat
from gateway.realtime.protocol import Protocol
from gateway.realtime.tool_config import apply_tools, choice_wire, tools_wire
from gateway.realtime.vad import INPUT_RATE
from gateway.tools.spec import Choice, Function, Named
from omnistream.request.media import AudioInput, ImageInput, VideoInput


def _tokens(value: int | str | None) -> int | None:
    return None if value in (None, "inf") else int(value)  # type: ignore[arg-type]


def given_voice(fields: Any, where: str) -> tuple[str, str] | None:
    """(the voice a session.update's or response.create's `fields` ask for, its param), or None."""
    output = fields.audio.output if fields.audio else None
    if output is not None and output.voice is not None:
        voice = output.voice
        return (voice.id if isinstance(voice, VoiceRef) else voice), f"{where}.audio.output.voice"
    if fields.voice is not None:
        return fields.voice, f"{where}.voice"
    return None


def given_format(fields: Any, side: str) -> AudioFormat | None:
    """The wire format a session.update's or response.create's `fields` ask for on `side` (`input`
    or `output`), GA (`audio.<side>.format`) or beta (`<side>_audio_format`); None: not given."""
    config = getattr(fields.audio, side, None) if fields.audio else None
    if config is not None and config.format is not None:
        return FORMATS[config.format.type]
    beta = getattr(fields, f"{side}_audio_format", None)
    return FORMATS[beta] if beta is not None else None


def voice_error(fields: Any, where: str, voices: tuple[str, ...] | None) -> EventError | None:
    """The refusal of a voice the deployment cannot speak (its own voices and OpenAI's names can
    be: gateway/api/openai/voices.py), or None."""
    given = given_voice(fields, where)
    if given is None or known(given[0], voices):
        return None
    voice, param = given
    return EventError(
        f"unknown voice {voice!r}; choose from {list(voices or ())} or one of OpenAI's voices",
        code="invalid_value",
        param=param,
    )


def apply_shared_fields(target: Any, fields: Any, voice: bool = True) -> None:
    """The fields session.update and response.create share, in either naming scheme (GA or beta),
    onto a session config or one response's settings: only the fields given change (the voice
    only with `voice`: the caller refused it otherwise)."""
    if fields.instructions is not None:
        target.instructions = fields.instructions
    modalities = fields.output_modalities or fields.modalities
    if modalities is not None:
        target.output_modalities = list(dict.fromkeys(modalities))
    given = given_voice(fields, "")
    if given is not None and voice:
        target.voice = given[0]
    tokens = (
        fields.max_output_tokens
        if fields.max_output_tokens is not None
        else fields.max_response_output_tokens
    )
    if tokens is not None:
        target.max_output_tokens = _tokens(tokens)
    if fields.temperature is not None:
        target.temperature = fields.temperature
    output_format = given_format(fields, "output")
    if output_format is not None:
        target.output_format = output_format


@dataclass
class SessionConfig:
    instructions: str | None = None
    voice: str | None = None  # as asked (None: the deployment's default voice)
    output_modalities: list[str] = field(default_factory=lambda: ["audio"])
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    max_output_tokens: int | None = None
    temperature: float | None = None
    extensions: Extensions = field(default_factory=Extensions)
    tools: tuple[Function, ...] = ()
    tool_choice: Choice | Named = "auto"
    input_format: AudioFormat = PCM16
    output_format: AudioFormat = PCM16
    transcription: InputTranscription | None = None  # None: the user's audio is not transcribed

    def apply(self, update: SessionFields, voices: tuple[str, ...] | None = None) -> list[EventError]:
        """Apply a session.update (GA or beta fields); only the fields it names change. A setting
        that cannot be served (a bad tool, a voice the deployment cannot speak) is refused alone:
        returned, naming it, while the rest applies."""
        refused: list[EventError] = []
        try:
            apply_tools(self, update, "session")
        except EventError as exc:
            refused.append(exc)
        bad_voice = voice_error(update, "session", voices)
        if bad_voice is not None:
            refused.append(bad_voice)
        apply_shared_fields(self, update, voice=bad_voice is None)
        given, detection = update.turn_detection_given()
        if given:
            self.turn_detection = detection
        given, transcription = update.transcription_given()
        if given:
            self.transcription = transcription
        if update.omnistream is not None:
            self.extensions = update.omnistream
        self.input_format = given_format(update, "input") or self.input_format
        return refused

    @property
    def speaks(self) -> bool:
        return "audio" in self.output_modalities

    def describe(
        self, protocol: Protocol, session_id: str, model: str, voice: str, speaker: str
    ) -> dict[str, Any]:
        """The session object of session.created / session.updated, in the connection's scheme:
        each setting as the client gave it (`voice`: as asked, or the default), and in `omnistream`
        what serves it where that differs from what OpenAI would do (`speaker`: the model's voice
        that speaks; the server VAD that serves the turn detection)."""
        td = self.turn_detection
        detection = None if td is None else td.wire()
        served = {"voice": speaker, "turn_detection": None if td is None else td.served().wire()}
        tokens: int | str = self.max_output_tokens or "inf"
        tool_choice = choice_wire(self.tool_choice, protocol.beta)
        if protocol.beta:  # no `model`: beta's schema takes only OpenAI's model names there
            return {
                "id": session_id,
                "object": "realtime.session",
                "modalities": self.output_modalities,
                "instructions": self.instructions or "",
                "voice": voice,
                "input_audio_format": self.input_format.beta,
                "output_audio_format": self.output_format.beta,
                "turn_detection": detection,
                "input_audio_transcription": self._transcription(beta=True),
                "temperature": self.temperature,
                "max_response_output_tokens": tokens,
                "tools": tools_wire(self.tools),
                "tool_choice": tool_choice,
                "omnistream": served,
            }
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": model,
            "output_modalities": self.output_modalities,
            "instructions": self.instructions or "",
            "audio": {
                "input": {
                    "format": self.input_format.wire(),
                    "turn_detection": detection,
                    "transcription": self._transcription(beta=False),
                },
                "output": {"format": self.output_format.wire(), "voice": voice},
            },
            "max_output_tokens": tokens,
            "tools": tools_wire(self.tools),
            "tool_choice": tool_choice,
            "omnistream": served,
        }

    def _transcription(self, beta: bool) -> dict[str, Any] | None:
        return None if self.transcription is None else self.transcription.wire(beta)


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
