"""Server events in the connection's naming: the GA names by default, the beta ones for a client
that sent `OpenAI-Beta: realtime=v1` (header or `openai-beta.realtime-v1` subprotocol).

Code everywhere else speaks GA names; `Protocol.event` renames, and drops what beta never had
(`conversation.item.done`, the `name` of `response.function_call_arguments.done`). Content part
types differ too: an item's part is GA `output_audio` / `output_text`, beta `audio` / `text`; the
part of a `response.content_part.*` event is `audio` / `text` in both schemas (the Agents SDK
fails to parse any other), which `Protocol.event` sees to as well.
Every server event validates against the official SDKs' schemas (tests/realtime_schemas.py).
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

BETA_NAMES = {
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "conversation.item.added": "conversation.item.created",
    "conversation.item.done": None,
}
BETA_PARTS = {"output_audio": "audio", "output_text": "text"}
BETA_DROPPED = {"response.function_call_arguments.done": ("name",)}  # fields beta's event lacks
PART_EVENTS = ("response.content_part.added", "response.content_part.done")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class Protocol:
    def __init__(self, beta: bool) -> None:
        self.beta = beta
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:12]

    def event(self, kind: str, **fields: Any) -> dict[str, Any] | None:
        """A server event named for this connection (None: beta has no such event)."""
        if kind in PART_EVENTS:
            part = fields["part"]
            fields["part"] = {**part, "type": BETA_PARTS.get(part["type"], part["type"])}
        if self.beta:
            for name in BETA_DROPPED.get(kind, ()):
                fields.pop(name, None)
        if self.beta and kind in BETA_NAMES:
            renamed = BETA_NAMES[kind]
            if renamed is None:
                return None
            kind = renamed
        return {"type": kind, "event_id": f"event_{self._prefix}{next(self._ids)}", **fields}

    def part_type(self, kind: str) -> str:
        return BETA_PARTS.get(kind, kind) if self.beta else kind

    def error(
        self,
        message: str,
        code: str,
        param: str | None = None,
        event_id: str | None = None,
        error_type: str = "invalid_request_error",
    ) -> dict[str, Any]:
        """The `error` event; `event_id` inside `error` names the client event that caused it."""
        event = self.event(
            "error",
            error={
                "type": error_type,
                "code": code,
                "message": message,
                "param": param,
                "event_id": event_id,
            },
        )
        assert event is not None
        return event
