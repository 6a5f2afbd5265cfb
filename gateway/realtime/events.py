"""Client events of the Realtime API, parsed and checked with pydantic.

Both schemes parse here: the GA session shape (`output_modalities`, `audio.input.format`,
`audio.input.turn_detection`, `audio.output.voice`) and the beta one (`modalities`, `voice`,
`input_audio_format: "pcm16"`, `turn_detection` at the top), whatever the connection's naming, so
a client mixing them still works. Unknown fields inside a session or response are ignored (OpenAI
adds fields often: tracing, include, noise_reduction...), but every field we use is strictly typed
and a wrong one is an `EventError` naming it. Audio is pcm16 at 24 kHz (`audio/pcm`, rate 24000,
or beta `pcm16`) or G.711 at 8 kHz (`audio/pcmu` / `audio/pcma`, beta `g711_ulaw` / `g711_alaw`:
gateway/realtime/formats.py).

A session.update is checked setting by setting (`partial`): a wrong setting is refused alone (an
`EventError` naming it, in `SessionUpdate.refused`) and the rest of the update still applies, so an
agent framework's first update (its instructions and tools beside something this server cannot
take) is never lost whole. Where OpenAI's schema allows what the model cannot do exactly, the
nearest is accepted (`semantic_vad`, a tool choice given before its tools, OpenAI's voice names):
docs/realtime.md "What is served for what is asked" has the table.
"""

from __future__ import annotations

import copy
import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError

from gateway.realtime.vad import SEMANTIC_SILENCE_MS

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


class TurnDetection(BaseModel):
    """`turn_detection`: `server_vad` (WebRTC's detector, vad.py), or `semantic_vad`, which this
    server has no model for: the same detector serves it, with the silence window of its
    `eagerness` (vad.py's SEMANTIC_SILENCE_MS). Beta may leave `type` out (server_vad)."""

    model_config = LENIENT
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=5000)
    silence_duration_ms: int = Field(500, ge=20, le=10000)
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
    seed: int | None = Field(None, ge=0, lt=2**63)
    max_audio_frames: int | None = Field(None, ge=1)


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
    temperature: float | None = Field(None, ge=0.0, le=2.0)
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


class ItemReference(BaseModel):
    """An item of the conversation named in a response's `input` (GA's `item_reference`)."""

    model_config = LENIENT
    type: Literal["item_reference"]
    id: Id


InputItem = Item | ItemReference
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
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    conversation: Literal["auto", "none"] | None = None
    # The response's own context instead of the conversation's (`[]`: none); out-of-band with
    # conversation `none` (gateway/realtime/responder.py).
    input: Annotated[list[InputItem], Field(max_length=1024)] | None = None
    metadata: Metadata | None = None


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    event_id: Id | None = None


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionFields
    # The settings refused alone (`partial`); what `session` holds is the rest.
    _refused: list[EventError] = PrivateAttr(default_factory=list)

    @property
    def refused(self) -> list[EventError]:
        return self._refused


class _SessionEnvelope(_Event):
    """A session.update before its settings are checked one by one."""

    type: Literal["session.update"]
    session: dict[str, Any]


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


class ItemRetrieve(_Event):
    type: Literal["conversation.item.retrieve"]
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
    | ItemRetrieve
    | ResponseCreate
    | ResponseCancel
)
EVENT_TYPES = {
    m.model_fields["type"].annotation.__args__[0]: m  # type: ignore[union-attr]
    for m in ClientEvent.__args__  # type: ignore[attr-defined]
}
# A session.update is read as its envelope first, its settings one by one after (`partial`).
_ADAPTERS = {name: TypeAdapter(model) for name, model in EVENT_TYPES.items()} | {
    "session.update": TypeAdapter(_SessionEnvelope)
}


def _tag(part: Any) -> bool:
    """A union member's tag in an error's location (`constrained-int`, `literal['inf']`, a model's
    class name), not a field: field names are lower case and plain."""
    return isinstance(part, str) and (any(c in part for c in "-['") or part[:1].isupper())


def _param(error: dict[str, Any]) -> str:
    """The field's path, the union-member tags left out."""
    return ".".join(str(p) for p in error["loc"] if not _tag(p))


# The settings of a session that stand alone: a top-level field, or one of `audio.input` or
# `audio.output` (its format, its turn detection, its voice).
NESTED_SETTINGS = {("audio", "input"), ("audio", "output")}
Fields = TypeVar("Fields", bound=BaseModel)


def _setting(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The setting an error's location is in (what is refused with it)."""
    depth = 3 if tuple(loc[:2]) in NESTED_SETTINGS else 1
    return tuple(loc[:depth])


def _remove(data: dict[str, Any], path: tuple[Any, ...]) -> bool:
    *parents, last = path
    for key in parents:
        data = data.get(key) if isinstance(data, dict) else None  # type: ignore[assignment]
    if isinstance(data, dict) and last in data:
        del data[last]
        return True
    return False


def partial(model: type[Fields], data: dict[str, Any], where: str) -> tuple[Fields, list[EventError]]:
    """`data` (the `where` of a `<where>.update`) as `model` less the settings that do not validate:
    each is refused alone, an EventError naming its field (`session.audio.input.format.rate`)."""
    data = copy.deepcopy(data)
    refused: list[EventError] = []
    while True:
        try:
            return model.model_validate(data), refused
        except ValidationError as exc:
            settings: set[tuple[Any, ...]] = set()
            for error in exc.errors():
                setting = _setting(error["loc"])
                if setting in settings or not _remove(data, setting):
                    continue
                settings.add(setting)
                param = f"{where}.{_param(error)}"
                message = f"invalid {where}.update: {param}: {error['msg']} (refused alone: the rest applies)"
                refused.append(EventError(message, code="invalid_value", param=param))
            if not settings:  # nothing left to take out: cannot happen for a dict of settings
                raise


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
        event = adapter.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise EventError(
            f"invalid {kind}: {_param(first)}: {first['msg']}",
            code="invalid_value",
            param=_param(first),
            event_id=event_id,
        ) from None
    if isinstance(event, _SessionEnvelope):
        fields, refused = partial(SessionFields, event.session, "session")
        update = SessionUpdate(type=event.type, event_id=event.event_id, session=fields)
        update.refused.extend(refused)
        return update
    return event
