"""Server events in the connection's naming (protocol.py): a response's content part is typed
`audio` / `text` in both schemes (the GA item's `output_audio` there failed the Agents SDK's
parsing of every spoken answer), and beta's events lack what its schema lacks."""

from __future__ import annotations

import pytest

from gateway.realtime.protocol import Protocol


@pytest.mark.parametrize("beta", [False, True])
@pytest.mark.parametrize(("item_part", "event_part"), [("output_audio", "audio"), ("output_text", "text")])
def test_a_content_part_event_types_its_part_audio_or_text(beta, item_part, event_part):
    protocol = Protocol(beta)
    for kind in ("response.content_part.added", "response.content_part.done"):
        event = protocol.event(kind, response_id="r", part={"type": item_part, "transcript": "hi"})
        assert event is not None and event["part"] == {"type": event_part, "transcript": "hi"}
    assert protocol.part_type(item_part) == (event_part if beta else item_part)  # an item's part


def test_beta_events_lack_what_beta_never_had():
    fields = {"call_id": "c", "name": "f", "arguments": "{}"}
    ga = Protocol(beta=False).event("response.function_call_arguments.done", **fields)
    beta = Protocol(beta=True).event("response.function_call_arguments.done", **fields)
    assert ga is not None and ga["name"] == "f"
    assert beta is not None and "name" not in beta and beta["arguments"] == "{}"
    assert Protocol(beta=True).event("conversation.item.done", item={}) is None
    renamed = Protocol(beta=True).event("response.output_audio.delta", delta="")
    assert renamed is not None and renamed["type"] == "response.audio.delta"
