"""Tool results must answer an earlier call."""

from __future__ import annotations

import pytest

from gateway.tools.history import check_tool_results
from omnistream.request.errors import InvalidValue

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_results_of_earlier_calls_pass():
    check_tool_results(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "42", "tool_call_id": "call_1"},
        ]
    )


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi"}, {"role": "tool", "content": "42", "tool_call_id": "call_1"}],
        [  # before the call
            {"role": "tool", "content": "42", "tool_call_id": "call_1"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
        ],
        [  # another call's id
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "42", "tool_call_id": "call_2"},
        ],
    ],
)
def test_a_result_of_no_earlier_call_is_a_400_naming_it(messages):
    with pytest.raises(InvalidValue) as caught:
        check_tool_results(messages)
    index = next(i for i, m in enumerate(messages) if m["role"] == "tool")
    assert caught.value.field == f"messages.{index}.tool_call_id"
