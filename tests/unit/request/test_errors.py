"""An error's kind is its class, and its stage a field set when it is built."""

from __future__ import annotations

import grpc

from omnistream.request.errors import (
    InternalError,
    InvalidRequest,
    InvalidValue,
    MediaExpired,
    OmniError,
    Unavailable,
    error_class,
    from_grpc,
    from_kind,
    status_of,
)


def test_a_known_kind_names_the_class_whatever_the_code_says():
    error = from_grpc(
        grpc.StatusCode.INVALID_ARGUMENT, "x", kind="invalid_value", field="tools", stage="thinker"
    )
    assert type(error) is InvalidValue and isinstance(error, InvalidRequest)
    assert (error.kind, error.field, error.stage) == ("invalid_value", "tools", "thinker")
    # FAILED_PRECONDITION alone is an InternalError; the kind the stage sent makes it what it is.
    assert type(from_grpc(grpc.StatusCode.FAILED_PRECONDITION, "x")) is InternalError
    assert type(from_grpc(grpc.StatusCode.FAILED_PRECONDITION, "x", kind="media_expired")) is MediaExpired


def test_an_unknown_kind_keeps_its_name_and_the_class_its_status_names():
    error = from_grpc(grpc.StatusCode.UNAVAILABLE, "x", kind="draining_soon")
    assert isinstance(error, Unavailable) and error.kind == "draining_soon"
    assert Unavailable.kind == "unavailable"  # the class the status names is untouched
    assert type(error) is error_class("draining_soon", Unavailable)  # made once per kind and class
    rest = from_kind("draining_soon", "x", field="voice")
    assert type(rest).__mro__[1] is OmniError and rest.kind == "draining_soon" and rest.field == "voice"
    assert type(from_kind("overloaded", "x")).__name__ == "Overloaded"


def test_no_stage_unless_given():
    assert Unavailable("x").stage is None and Unavailable("x", stage="talker").stage == "talker"


def test_a_kind_the_table_does_not_know_takes_the_status_of_the_class_it_was_made_from():
    too_long = error_class("context_length_exceeded", InvalidRequest)("the turn does not fit")
    assert too_long.kind == "context_length_exceeded"
    assert status_of(too_long) == status_of(InvalidRequest("x"))
    assert status_of(from_kind("some_newer_kind", "?")) == status_of(InternalError("x"))
    assert status_of(ValueError("not ours")) == status_of(InternalError("x"))
