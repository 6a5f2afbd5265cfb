"""A conversation's tool results must answer its calls: a `tool` turn whose `tool_call_id` no earlier
assistant turn's call has is refused (OpenAI refuses it too), rather than shown to the model as a
result of nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from omnistream.request.errors import InvalidValue


def check_tool_results(messages: Sequence[Mapping[str, Any]], param: str = "messages") -> None:
    """Turns in the request model's form (GenerationRequest.messages); the error names
    `{param}.{i}.tool_call_id`."""
    called: set[str] = set()
    for i, message in enumerate(messages):
        for call in message.get("tool_calls") or ():
            if call.get("id"):
                called.add(call["id"])
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in called:
                raise InvalidValue(
                    f"the tool message {i} answers call {call_id!r}, which no earlier assistant message made",
                    field=f"{param}.{i}.tool_call_id",
                )
