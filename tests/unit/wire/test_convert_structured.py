"""A request's output grammar on the stage wire: from GenerationRequest through the stage chain's
thinker params into ThinkerOpen and back, and checked on arrival (kind, size, a missing spec)."""

from __future__ import annotations

import pytest

from omnistream.proto.omni.v1 import common_pb2
from omnistream.request.errors import InvalidRequest
from omnistream.request.generation import GenerationRequest
from omnistream.request.stage_chain import stage_opens
from omnistream.request.structured import MAX_SPEC_BYTES, StructuredOutput
from omnistream.wire.convert import structured_output_from_proto, thinker_open_proto

pytestmark = pytest.mark.unit

SCHEMA = StructuredOutput("json_schema", '{"type": "object"}')


def test_the_grammar_travels_from_the_request_to_the_thinker_open_and_back():
    request = GenerationRequest(prompt_ids=[1, 2], return_audio=False, structured_output=SCHEMA)
    opens = stage_opens(request, None)
    assert opens.thinker.structured_output == SCHEMA
    open_ = thinker_open_proto("r", opens, None, [1, 2])
    assert open_.HasField("structured_output")
    assert structured_output_from_proto(open_.structured_output) == SCHEMA


def test_a_request_without_one_sends_none():
    open_ = thinker_open_proto("r", stage_opens(GenerationRequest(prompt_ids=[1]), None), None, [1])
    assert not open_.HasField("structured_output")


def test_json_object_needs_no_spec():
    msg = common_pb2.StructuredOutput(kind="json_object")
    assert structured_output_from_proto(msg) == StructuredOutput("json_object")


@pytest.mark.parametrize(
    ("kind", "spec", "field"),
    [
        ("regex", "a+", "structured_output.kind"),
        ("", "", "structured_output.kind"),
        ("json_schema", "x" * (MAX_SPEC_BYTES + 1), "response_format"),
        ("structural_tag", "é" * (MAX_SPEC_BYTES // 2 + 1), "tools"),  # bytes, not characters
        ("json_schema", "  ", "response_format"),
        ("structural_tag", "", "tools"),
    ],
)
def test_a_bad_grammar_is_refused_on_arrival_naming_the_field(kind, spec, field):
    with pytest.raises(InvalidRequest) as err:
        structured_output_from_proto(common_pb2.StructuredOutput(kind=kind, spec=spec))
    assert err.value.field == field


def test_the_largest_spec_passes():
    spec = "x" * MAX_SPEC_BYTES
    assert (
        structured_output_from_proto(common_pb2.StructuredOutput(kind="json_schema", spec=spec)).spec == spec
    )
