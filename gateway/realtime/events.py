"""Client events of the Realtime API, parsed and checked with pydantic.

Both schemes parse here: the GA session shape (`output_modalities`, `audio.input.format`,
`audio.input.turn_detection`, `audio.output.voice`) and the beta one (`modalities`, `voice`,
`input_audio_format: "pcm16"`, `turn_detection` at the top), whatever the connection's naming, so
a client mixing them still works. Unknown fields inside a session or response are ignored (OpenAI
adds fields often: tracing, include, noise_reduction...), but every field we use is strictly typed
and a wrong one is an `EventError` naming it. Audio must be pcm16 at 24 kHz (`audio/pcm`, rate
24000, or beta `pcm16`): the only format served.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

LENIENT = ConfigDict(extra="ignore", strict=True)
MAX_TEXT = 100_000  # characters of instructions or of one text part
Id = Annotated[str, Field(min_length=1, max_length=64)]


class EventError(Exception):
    """A client event that cannot be served: becomes an `error` server event, the session lives on."""

    def __init__(
        self,
        message: str,
        code: str = "invalid_request_error",
        param: str | None = None,
        event_id: str | None = None,
        error_type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.event_id = event_id
        self.error_type = error_type


class ServerVad(BaseModel):
    model_config = LENIENT
    type: Literal["server_vad"]
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=5000)
    silence_duration_ms: int = Field(500, ge=20, le=10000)
    create_response: bool = True
    interrupt_response: bool = True


class PcmFormat(BaseModel):
    model_config = LENIENT
    type: Literal["audio/pcm"]
    rate: Literal[24000] = 24000


class AudioInputConfig(BaseModel):
    model_config = LENIENT
    format: PcmFormat | None = None
    turn_detection: ServerVad | None = None


class AudioOutputConfig(BaseModel):
    model_config = LENIENT
    format: PcmFormat | None = None
    voice: Annotated[str, Field(max_length=256)] | None = None


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
    seed: int | None = Field(None, ge=0, lt=2**63)
    max_audio_frames: int | None = Field(None, ge=1)


class FunctionTool(BaseModel):
    """A tool of the session (or of one response): the Realtime API's function object."""

    model_config = LENIENT
    type: Literal["function"]
    name: Annotated[str, Field(max_length=256)]
    description: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    parameters: dict[str, Any] | None = None


class FunctionChoice(BaseModel):
    """`tool_choice` naming one function."""

    model_config = LENIENT
    type: Literal["function"]
    name: Annotated[str, Field(max_length=256)]


Tools = Annotated[list[FunctionTool], Field(max_length=128)]
ToolChoice = Literal["auto", "none", "required"] | FunctionChoice


class SessionFields(BaseModel):
    model_config = LENIENT
    type: Literal["realtime"] | None = None
    instructions: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    output_modalities: Modalities | None = None
    modalities: Modalities | None = None  # beta
    voice: Annotated[str, Field(max_length=256)] | None = None  # beta
    audio: AudioConfig | None = None
    input_audio_format: Literal["pcm16"] | None = None  # beta
    output_audio_format: Literal["pcm16"] | None = None  # beta
    turn_detection: ServerVad | None = None  # beta (null: none)
    max_output_tokens: MaxTokens | None = None
    max_response_output_tokens: MaxTokens | None = None  # beta
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    omnistream: Extensions | None = None

    def turn_detection_given(self) -> tuple[bool, ServerVad | None]:
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


class ContentPart(BaseModel):
    model_config = LENIENT
    type: Literal["input_text", "input_audio", "input_image", "text", "output_text", "output_audio", "audio"]
    text: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    audio: str | None = None  # base64 pcm16 24 kHz
    image_url: str | None = None  # data URL
    transcript: Annotated[str, Field(max_length=MAX_TEXT)] | None = None


class Item(BaseModel):
    """A created item: a message (role and content), a function call (call_id, name, arguments)
    or a call's result (call_id, output); what each needs is checked where it is made."""

    model_config = LENIENT
    id: Id | None = None
    type: Literal["message", "function_call", "function_call_output"] = "message"
    role: Literal["user", "assistant", "system"] | None = None
    content: Annotated[list[ContentPart], Field(min_length=1, max_length=64)] | None = None
    call_id: Id | None = None
    name: Annotated[str, Field(max_length=256)] | None = None
    arguments: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    output: Annotated[str, Field(max_length=MAX_TEXT)] | None = None


class ResponseFields(BaseModel):
    model_config = LENIENT
    instructions: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    output_modalities: Modalities | None = None
    modalities: Modalities | None = None  # beta
    voice: Annotated[str, Field(max_length=256)] | None = None  # beta
    audio: AudioConfig | None = None
    max_output_tokens: MaxTokens | None = None
    max_response_output_tokens: MaxTokens | None = None  # beta
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    conversation: Literal["auto", "none"] | None = None


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    event_id: Id | None = None


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionFields


class BufferAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str


class BufferCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class BufferClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ItemCreate(_Event):
    type: Literal["conversation.item.create"]
    item: Item
    previous_item_id: Id | None = None


class ItemTruncate(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: Id
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class ItemDelete(_Event):
    type: Literal["conversation.item.delete"]
    item_id: Id


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: ResponseFields | None = None


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: Id | None = None


ClientEvent = (
    SessionUpdate
    | BufferAppend
    | BufferCommit
    | BufferClear
    | ItemCreate
    | ItemTruncate
    | ItemDelete
    | ResponseCreate
    | ResponseCancel
)
EVENT_TYPES = {
    m.model_fields["type"].annotation.__args__[0]: m  # type: ignore[union-attr]
    for m in ClientEvent.__args__  # type: ignore[attr-defined]
}
_ADAPTERS = {name: TypeAdapter(model) for name, model in EVENT_TYPES.items()}


def _param(error: dict[str, Any]) -> str:
    """The field's path; pydantic's union-member tags (`constrained-int`, `literal['inf']`) left out."""
    return ".".join(str(p) for p in error["loc"] if not (isinstance(p, str) and any(c in p for c in "-['")))


def parse(text: str) -> ClientEvent:
    """One text frame as a client event, or `EventError` (with the event's id when it had one)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise EventError(f"the message is not valid JSON ({exc})", code="invalid_json") from None
    if not isinstance(data, dict):
        raise EventError("an event must be a JSON object", code="invalid_event")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    kind = data.get("type")
    if not isinstance(kind, str):
        raise EventError(
            "the event has no string `type`", code="invalid_event", param="type", event_id=event_id
        )
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        raise EventError(
            f"unknown or unsupported event type {kind[:64]!r}",
            code="unknown_event",
            param="type",
            event_id=event_id,
        )
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise EventError(
            f"invalid {kind}: {_param(first)}: {first['msg']}",
            code="invalid_value",
            param=_param(first),
            event_id=event_id,
        ) from None
