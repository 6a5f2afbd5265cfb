"""Client events of the Realtime API, parsed and checked with pydantic: one text frame becomes one
event (the envelope here; the settings it carries in gateway/realtime/settings.py, its items in
client_items.py), or an `EventError` the connection answers with an `error` server event.

A session.update is checked setting by setting (`partial`): a wrong setting is refused alone (an
`EventError` naming it, in `SessionUpdate.refused`) and the rest of the update still applies, so an
agent framework's first update (its instructions and tools beside something this server cannot
take) is never lost whole.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from gateway.realtime.client_items import Item
from gateway.realtime.field_types import Id
from gateway.realtime.settings import ResponseFields, SessionFields
from omnistream.request.errors import OmniError


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

    @classmethod
    def of(cls, exc: OmniError, event_id: str | None = None) -> EventError:
        """The request error `exc` as the error event of the client event `event_id` (its kind is
        the code, its field the param)."""
        return cls(exc.message, code=exc.kind, param=exc.field, event_id=event_id)


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


def _event_type(model: type[BaseModel]) -> str:
    """The `type` an event model takes: the one value of its `Literal`."""
    return str(get_args(model.model_fields["type"].annotation)[0])


EVENT_TYPES: dict[str, type[BaseModel]] = {_event_type(m): m for m in get_args(ClientEvent)}
# A session.update is read as its envelope first, its settings one by one after (`partial`).
_ADAPTERS: dict[str, TypeAdapter[Any]] = {name: TypeAdapter(model) for name, model in EVENT_TYPES.items()} | {
    "session.update": TypeAdapter(_SessionEnvelope)
}


def _tag(part: Any) -> bool:
    """A union member's tag in an error's location (`constrained-int`, `literal['inf']`, a model's
    class name), not a field: field names are lower case and plain."""
    return isinstance(part, str) and (any(c in part for c in "-['") or part[:1].isupper())


def _param(error: ErrorDetails) -> str:
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
    node: Any = data
    for key in parents:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict) and last in node:
        del node[last]
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
        event: ClientEvent | _SessionEnvelope = adapter.validate_python(data)
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
