"""The talker gets the thinker chunk's spoken tokens (ThinkerChunk.spoken), never a tool call."""

from __future__ import annotations

import pytest

from omnistream.proto.omni.v1 import stage_pb2
from omnistream.wire.convert import talker_input_proto

pytestmark = pytest.mark.unit


def test_the_talker_gets_the_spoken_tokens():
    chunk = stage_pb2.ThinkerChunk(token_ids=[5, 6, 7], spoken=stage_pb2.SpokenTokens(token_ids=[4, 5]))
    assert list(talker_input_proto(chunk).token_ids) == [4, 5]


def test_nothing_spoken_is_no_token():
    chunk = stage_pb2.ThinkerChunk(token_ids=[5, 6], finished=True)
    chunk.spoken.SetInParent()
    msg = talker_input_proto(chunk)
    assert list(msg.token_ids) == [] and msg.last


def test_a_thinker_without_the_field_is_spoken_whole():
    chunk = stage_pb2.ThinkerChunk(token_ids=[5, 6])
    assert list(talker_input_proto(chunk).token_ids) == [5, 6]
