"""Server events of `/v1/realtime` checked against the published schemas of the official SDKs, as
strictly as their types allow: openai-python's event models (GA `openai.types.realtime`, beta
`openai.types.beta.realtime`) validated in pydantic's strict mode from the JSON text, with no field
the schema does not have, and (GA) the Agents SDK's own parsing of server events (its TypeAdapter,
`agents.realtime.openai_realtime.get_server_event_type_adapter`, which the SDK runs on every event
and logs `Failed to validate server event` for one that fails).

The SDKs' models accept unknown fields, so a field a client does not expect would pass them; here
it fails, except those in `EXTRA`: what OpenAI's own server sends beyond the types (a session's
`id` and `object`), and omnistream's documented extensions (`omnistream` objects).
"""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Iterable
from typing import Any

from openai.types.beta.realtime import realtime_server_event as beta_events
from openai.types.realtime import realtime_server_event as ga_events
from pydantic import BaseModel

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # the Agents SDK must not phone home

# (event type, dotted path of the field): fields allowed beyond the schema's.
EXTRA = {
    ("session.created", "session.id"),
    ("session.created", "session.object"),
    ("session.created", "session.omnistream"),
    ("session.updated", "session.id"),
    ("session.updated", "session.object"),
    ("session.updated", "session.omnistream"),
    ("response.created", "response.omnistream"),
    ("response.done", "response.omnistream"),
}


def _models(union: Any) -> dict[str, type[BaseModel]]:
    """Event type -> its model, from an SDK's server-event union."""
    members = typing.get_args(typing.get_args(union)[0])
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in members}


GA = _models(ga_events.RealtimeServerEvent)
BETA = _models(beta_events.RealtimeServerEvent)


def _extras(value: Any, path: str) -> Iterable[str]:
    """Dotted paths of the fields a validated model kept beyond its schema."""
    if isinstance(value, BaseModel):
        for name in value.model_extra or {}:
            yield f"{path}.{name}".lstrip(".")
        for name in type(value).model_fields:
            yield from _extras(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _extras(item, f"{path}.{i}")


def _agents_adapter() -> Any:
    """The Agents SDK's server-event TypeAdapter, or None when openai-agents is not installed."""
    try:
        from agents.realtime.openai_realtime import get_server_event_type_adapter
    except ImportError:
        return None
    return get_server_event_type_adapter()


def check_server_event(event: dict[str, Any], beta: bool) -> None:
    """Raise (AssertionError or pydantic's ValidationError) unless `event` validates strictly
    against the SDKs' schema of its type, in the connection's naming."""
    kind = event.get("type")
    models = BETA if beta else GA
    assert kind in models, f"{kind!r} is no {'beta' if beta else 'GA'} server event"
    parsed = models[kind].model_validate_json(json.dumps(event), strict=True)
    unknown = [path for path in _extras(parsed, "") if (kind, _generic(path)) not in EXTRA]
    assert not unknown, f"{kind}: fields not in the schema: {unknown}"
    if not beta:
        adapter = _agents_adapter()
        if adapter is not None:
            adapter.validate_python(event)


def _generic(path: str) -> str:
    """`response.output.0.x` -> `response.output.x`: EXTRA names fields, not list positions."""
    return ".".join(p for p in path.split(".") if not p.isdigit())


def check_server_events(events: Iterable[dict[str, Any]], beta: bool) -> list[str]:
    """Every event checked; returns the failures as `type: reason` (empty: all valid)."""
    failures = []
    for event in events:
        try:
            check_server_event(event, beta)
        except Exception as exc:  # a ValidationError or an AssertionError: reported together
            failures.append(f"{event.get('type')}: {exc}")
    return failures
