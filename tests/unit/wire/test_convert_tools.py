"""A chat's tool calls, tool results and tools through the stage API and back."""

from __future__ import annotations

import pytest

from omnistream.request.errors import InvalidRequest
from omnistream.wire.convert import tools_from_proto, tools_to_proto
from omnistream.wire.messages import message_proto, messages_from_proto

CALLS = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]


def test_calls_and_results_round_trip():
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": CALLS},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]
    assert messages_from_proto([message_proto(t) for t in turns]) == turns


def test_tools_round_trip_and_none_is_empty():
    tools = [{"type": "function", "function": {"name": "f", "description": "é", "parameters": {}}}]
    assert tools_from_proto(tools_to_proto(tools)) == tools
    assert tools_to_proto(None) == tools_to_proto([]) == "" and tools_from_proto("") is None


@pytest.mark.parametrize("text", ["{", '{"name": "f"}', "[1]", '[{"function": {}}]'])
def test_malformed_tools_are_the_senders_bug(text):
    with pytest.raises(InvalidRequest) as caught:
        tools_from_proto(text)
    assert caught.value.field == "tools"
