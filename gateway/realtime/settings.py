"""The settings client events carry, parsed and checked with pydantic: session.update's `session`
and response.create's `response`, with their parts (turn detection, audio formats, the input
transcription, voices, tools).

Both schemes parse here: the GA session shape (`output_modalities`, `audio.input.format`,
`audio.input.turn_detection`, `audio.output.voice`) and the beta one (`modalities`, `voice`,
`input_audio_format: "pcm16"`, `turn_detection` at the top), whatever the connection's naming, so
a client mixing them still works. Unknown fields are ignored, but every field we use is strictly
typed and a wrong one is refused naming it (gateway/realtime/events.py). Audio is pcm16 at 24 kHz
(`audio/pcm`, rate 24000, or beta `pcm16`) or G.711 at 8 kHz (`audio/pcmu` / `audio/pcma`, beta
`g711_ulaw` / `g711_alaw`: gateway/realtime/formats.py). Where OpenAI's schema allows what the
model cannot do exactly, the nearest is accepted (`semantic_vad`, a tool choice given before its
tools, OpenAI's voice names): docs/realtime.md "What is served for what is asked" has the table.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.realtime.client_items import InputItem
from gateway.realtime.field_types import LENIENT, MAX_TEXT
from gateway.realtime.vad import SEMANTIC_SILENCE_MS


class TurnDetection(BaseModel):
    """`turn_detection`: `server_vad` (WebRTC's detector, vad.py), or `semantic_vad`, which this
    server has no model for: the same detector serves it, with the silence window of its
    `eagerness` (vad.py's SEMANTIC_SILENCE_MS). Beta may leave `type` out (server_vad)."""

    model_config = LENIENT
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(default=300, ge=0, le=5000)
    silence_duration_ms: int = Field(default=500, ge=20, le=10000)
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"  # semantic_vad

    def served(self) -> TurnDetection:
        """The server VAD that serves it (itself for server_vad)."""
        if self.type == "server_vad":
            return self
        silence = SEMANTIC_SILENCE_MS[self.eagerness]
        return self.model_copy(update={"type": "server_vad", "silence_duration_ms": silence})

    def wire(self) -> dict[str, Any]:
        """As session.created / session.updated show it: the fields of its type in OpenAI's schema."""
        common = {"create_response": self.create_response, "interrupt_response": self.interrupt_response}
        if self.type == "semantic_vad":
            return {"type": self.type, "eagerness": self.eagerness, **common}
        return {
            "type": self.type,
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            **common,
        }


class PcmFormat(BaseModel):
    model_config = LENIENT
    type: Literal["audio/pcm"]
    rate: Literal[24000] = 24000


class G711Format(BaseModel):
    """G.711 at 8 kHz (the rate is implied: OpenAI's schema has no `rate` for it)."""

    model_config = LENIENT
    type: Literal["audio/pcmu", "audio/pcma"]


WireFormat = PcmFormat | G711Format
BetaFormat = Literal["pcm16", "g711_ulaw", "g711_alaw"]


Language = Annotated[str, Field(pattern=r"^[a-z]{2,3}$")]  # ISO-639


class InputTranscription(BaseModel):
    """`audio.input.transcription` (beta `input_audio_transcription`): each committed user audio
    item is transcribed by the thinker itself, whatever transcription `model` is named
    (gateway/serving/transcription.py); `language`, `prompt` and `keywords` guide it."""

    model_config = LENIENT
    model: Annotated[str, Field(max_length=256)] | None = None
    language: Language | None = None
    languages: Annotated[list[Language], Field(max_length=16)] | None = None
    prompt: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    keywords: Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=256)] | None = None

    @property
    def spoken(self) -> str | None:
        """The language the speech is in, when one is given."""
        return self.language or (self.languages[0] if self.languages else None)

    @property
    def context(self) -> str | None:
        """What guides the transcript: the prompt and the keywords."""
        words = ", ".join(self.keywords or ())
        return " ".join(p for p in (self.prompt, words and f"Keywords: {words}.") if p) or None

    def wire(self, beta: bool) -> dict[str, Any]:
        """As session.created / session.updated show it: what was given."""
        fields = (
            ("model", "language", "prompt")
            if beta
            else ("model", "language", "languages", "prompt", "keywords")
        )
        return {name: getattr(self, name) for name in fields if getattr(self, name) is not None}


class AudioInputConfig(BaseModel):
    model_config = LENIENT
    format: WireFormat | None = None
    turn_detection: TurnDetection | None = None
    transcription: InputTranscription | None = None


Voice = Annotated[str, Field(max_length=256)]


class VoiceRef(BaseModel):
    """A voice given as `{"id": ...}` (GA's custom voice object): the voice of that name."""

    model_config = LENIENT
    id: Voice


class AudioOutputConfig(BaseModel):
    model_config = LENIENT
    format: WireFormat | None = None
    voice: Voice | VoiceRef | None = None


class AudioConfig(BaseModel):
    model_config = LENIENT
    input: AudioInputConfig | None = None
    output: AudioOutputConfig | None = None


Modalities = Annotated[list[Literal["text", "audio"]], Field(min_length=1, max_length=2)]
MaxTokens = Annotated[int, Field(ge=1, le=1_000_000)] | Literal["inf"]


class Extensions(BaseModel):
    """omnistream's own knobs (`session.omnistream`): for tests and benchmarks."""

    model_config = ConfigDict(extra="forbid", strict=True)
    ignore_eos: bool | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    max_audio_frames: int | None = Field(default=None, ge=1)


class FunctionTool(BaseModel):
    """A tool of the session (or of one response): the Realtime API's function object."""

    model_config = LENIENT
    type: Literal["function"] = "function"  # optional in OpenAI's schemas
    name: Annotated[str, Field(max_length=256)]
    description: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    parameters: dict[str, Any] | None = None


class FunctionChoice(BaseModel):
    """`tool_choice` naming one function."""

    model_config = LENIENT
    type: Literal["function"]
    name: Annotated[str, Field(max_length=256)]


Tools = Annotated[list[FunctionTool], Field(max_length=128)]
# `auto`, `none`, `required`, a named function; beta's tool_choice is any string: a function's name.
ToolChoice = FunctionChoice | Annotated[str, Field(min_length=1, max_length=256)]


class SessionFields(BaseModel):
    model_config = LENIENT
    type: Literal["realtime"] | None = None
    instructions: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    output_modalities: Modalities | None = None
    modalities: Modalities | None = None  # beta
    voice: Voice | None = None  # beta
    audio: AudioConfig | None = None
    input_audio_format: BetaFormat | None = None  # beta
    output_audio_format: BetaFormat | None = None  # beta
    turn_detection: TurnDetection | None = None  # beta (null: none)
    input_audio_transcription: InputTranscription | None = None  # beta (null: none)
    max_output_tokens: MaxTokens | None = None
    max_response_output_tokens: MaxTokens | None = None  # beta
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    omnistream: Extensions | None = None

    def turn_detection_given(self) -> tuple[bool, TurnDetection | None]:
        """(whether the update sets turn detection, the new value: None turns it off)."""
        if (
            self.audio is not None
            and self.audio.input is not None
            and "turn_detection" in (self.audio.input.model_fields_set)
        ):
            return True, self.audio.input.turn_detection
        if "turn_detection" in self.model_fields_set:
            return True, self.turn_detection
        return False, None

    def transcription_given(self) -> tuple[bool, InputTranscription | None]:
        """(whether the update sets the input transcription, the new value: None turns it off)."""
        if (
            self.audio is not None
            and self.audio.input is not None
            and "transcription" in self.audio.input.model_fields_set
        ):
            return True, self.audio.input.transcription
        if "input_audio_transcription" in self.model_fields_set:
            return True, self.input_audio_transcription
        return False, None


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]], Field(max_length=16)
]


class ResponseFields(BaseModel):
    model_config = LENIENT
    instructions: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    output_modalities: Modalities | None = None
    modalities: Modalities | None = None  # beta
    voice: Voice | None = None  # beta
    audio: AudioConfig | None = None
    output_audio_format: BetaFormat | None = None  # beta
    max_output_tokens: MaxTokens | None = None
    max_response_output_tokens: MaxTokens | None = None  # beta
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    conversation: Literal["auto", "none"] | None = None
    # The response's own context instead of the conversation's (`[]`: none); out-of-band with
    # conversation `none` (gateway/realtime/responder.py).
    input: Annotated[list[InputItem], Field(max_length=1024)] | None = None
    metadata: Metadata | None = None
