"""A session's buffer, append rate, history bounds and truncation."""

from __future__ import annotations

import pytest

from gateway.realtime.events import EventError
from gateway.realtime.session import AppendRate, Conversation, InputBuffer, Item


def test_input_buffer_is_bounded_and_tracks_stream_positions():
    buffer = InputBuffer(max_bytes=100)
    assert buffer.append(bytes(60))
    assert not buffer.append(bytes(60))  # refused whole, nothing half-added
    assert buffer.end == 30
    buffer.keep_from(20)
    assert (buffer.start, len(buffer.data)) == (20, 20)
    assert buffer.append(bytes(60))
    assert len(buffer.take(40)) == 40 and buffer.start == 40
    buffer.clear()
    assert buffer.start == buffer.end == 60


def test_append_rate_allows_a_burst_then_real_time():
    now = [0.0]
    rate = AppendRate(2.0, clock=lambda: now[0])
    assert rate.take(1.5)
    assert not rate.take(1.0)
    now[0] += 0.5
    assert rate.take(1.0)
    now[0] += 100.0  # a long pause does not bank more than the burst
    assert rate.take(2.0) and not rate.take(0.1)


def user(item_id: str, seconds: float = 0.0) -> Item:
    return Item(item_id, "user", [{"type": "text", "text": item_id}], [], audio_seconds=seconds)


def test_history_drops_the_oldest_items_past_its_bounds():
    conversation = Conversation(max_items=3, max_audio_seconds=10.0)
    assert conversation.add(user("a", 4.0)) == []
    assert conversation.add(user("b")) == []
    assert conversation.add(user("c", 4.0)) == []
    assert conversation.add(user("d")) == ["a"]  # items
    assert conversation.add(user("e", 7.0)) == ["b", "c"]  # audio seconds
    assert list(conversation.items) == ["d", "e"]
    with pytest.raises(EventError):
        conversation.add(user("d"))
    with pytest.raises(EventError):
        conversation.get("a")


def test_truncation_keeps_the_share_of_text_that_was_heard():
    item = Item("x", "assistant", [], [{"type": "output_audio"}], text="0123456789")
    item.audio_samples_made = 24000  # 1 s made
    item.truncate(300)
    assert (item.audio_end_ms, item.text) == (300, "012")
