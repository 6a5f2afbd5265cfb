"""One table from internal errors to gRPC and HTTP status.

Engines raise these domain errors and know nothing about transports; the gRPC servicers and the
gateway translate them through `STATUS_TABLE` so a given failure always surfaces the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import grpc


class OmniError(Exception):
    """Base class: every error a client may see carries a message meant for that client.

    `kind` is the class's (an error's kind is its class: `error_class`); `field` the request
    parameter it names, `stage` the stage it came from (set by the gateway for a stage's error: a
    replica of that stage may be down, gateway/serving/stage_errors.py `stage_error`)."""

    kind: ClassVar[str] = "internal"

    def __init__(self, message: str, *, field: str | None = None, stage: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.stage = stage


class InvalidRequest(OmniError):
    """Bad parameters or malformed input; the request is rejected, the service keeps serving."""

    kind = "invalid_request"


class InvalidValue(InvalidRequest):
    """A request of the right shape whose values do not hold together: a tool's `parameters` that
    are not a JSON schema, a `tool_choice` naming a function the request does not offer, a tool
    result answering no call, an output grammar too large. HTTP 400, as OpenAI answers these (a
    shape error stays `InvalidRequest`'s 422, the project's answer to malformed input)."""

    kind = "invalid_value"


class TooLarge(InvalidRequest):
    """The request (its body or its prompt) is over a configured size limit: HTTP 413.

    INVALID_ARGUMENT on gRPC, not RESOURCE_EXHAUSTED: the same request will never fit, whatever the
    load, so clients must not treat it as the retryable overload that RESOURCE_EXHAUSTED (with its
    `retry-after` metadata) means in this project, and `from_grpc` maps RESOURCE_EXHAUSTED back to
    `Overloaded`. (gRPC's own message-size refusal, before our code runs, stays RESOURCE_EXHAUSTED.)
    """

    kind = "request_too_large"


class SequenceError(InvalidRequest):
    """A chunk arrived out of order or twice: never handled silently."""

    kind = "sequence_error"


class Overloaded(OmniError):
    """Admission refused because the bound on concurrent work is reached."""

    kind = "overloaded"


class Unavailable(OmniError):
    """The service is starting, draining or has no healthy replica."""

    kind = "unavailable"


class Unauthenticated(OmniError):
    """A public API call without a valid API key (or client certificate)."""

    kind = "unauthenticated"


class DeadlineExceeded(OmniError):
    kind = "deadline_exceeded"


class Cancelled(OmniError):
    kind = "cancelled"


class NotFound(OmniError):
    kind = "not_found"


class MediaExpired(OmniError):
    """An audio part named by its digest that the thinker no longer keeps (evicted, released, or a
    restarted or other replica): the gateway sends the samples again (gateway/serving/sent_audio.py)."""

    kind = "media_expired"


class InternalError(OmniError):
    kind = "internal"


@dataclass(frozen=True)
class Status:
    grpc_code: grpc.StatusCode
    http_status: int


STATUS_TABLE: dict[str, Status] = {
    InvalidRequest.kind: Status(grpc.StatusCode.INVALID_ARGUMENT, 422),
    SequenceError.kind: Status(grpc.StatusCode.INVALID_ARGUMENT, 422),
    InvalidValue.kind: Status(grpc.StatusCode.INVALID_ARGUMENT, 400),
    TooLarge.kind: Status(grpc.StatusCode.INVALID_ARGUMENT, 413),
    Overloaded.kind: Status(grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
    Unavailable.kind: Status(grpc.StatusCode.UNAVAILABLE, 503),
    Unauthenticated.kind: Status(grpc.StatusCode.UNAUTHENTICATED, 401),
    DeadlineExceeded.kind: Status(grpc.StatusCode.DEADLINE_EXCEEDED, 504),
    Cancelled.kind: Status(grpc.StatusCode.CANCELLED, 499),
    NotFound.kind: Status(grpc.StatusCode.NOT_FOUND, 404),
    MediaExpired.kind: Status(grpc.StatusCode.FAILED_PRECONDITION, 409),
    InternalError.kind: Status(grpc.StatusCode.INTERNAL, 500),
}

_BY_GRPC: dict[grpc.StatusCode, type[OmniError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.OUT_OF_RANGE: InvalidRequest,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Overloaded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.NOT_FOUND: NotFound,
}


def status_of(error: BaseException) -> Status:
    """The error's status: its kind's, or for a kind the table does not know (`error_class`) the
    status of the class it was made from; anything not an OmniError is an internal error."""
    if isinstance(error, OmniError):
        for cls in type(error).__mro__:
            status = STATUS_TABLE.get(getattr(cls, "kind", ""))
            if status is not None:
                return status
    return STATUS_TABLE[InternalError.kind]


_BY_KIND: dict[str, type[OmniError]] = {
    cls.kind: cls
    for cls in (
        InvalidRequest,
        InvalidValue,
        TooLarge,
        SequenceError,
        Overloaded,
        Unavailable,
        Unauthenticated,
        DeadlineExceeded,
        Cancelled,
        NotFound,
        MediaExpired,
        InternalError,
    )
}


_UNKNOWN_KINDS: dict[tuple[str, type[OmniError]], type[OmniError]] = {}  # `error_class`'s own


def error_class(kind: str, base: type[OmniError] = OmniError) -> type[OmniError]:
    """The class of errors of `kind`: the table's (`_BY_KIND`), else a subclass of `base` made once
    per (kind, base) whose `kind` is it, so that a newer server's kind this version does not know
    still reaches the caller as a typed error of that kind, of the class its status names (`base`).
    Such a class exists only in this process (it does not pickle by name)."""
    known = _BY_KIND.get(kind)
    if known is not None:
        return known
    made = _UNKNOWN_KINDS.get((kind, base))
    if made is None:
        doc = f"An error of kind {kind!r}, unknown to this version."
        namespace = {"kind": kind, "__doc__": doc, "__module__": __name__}
        made = type(f"{base.__name__}[{kind}]", (base,), namespace)
        _UNKNOWN_KINDS[(kind, base)] = made
    return made


def from_grpc(
    code: grpc.StatusCode,
    message: str,
    *,
    kind: str | None = None,
    field: str | None = None,
    stage: str | None = None,
) -> OmniError:
    """Turn a stage's gRPC status back into the domain error (the gateway re-raises it). `kind`:
    the error kind the status carried (its metadata), which names the class (`error_class`, of the
    code's class for a kind this version does not know); without it the code does."""
    base = _BY_GRPC.get(code, InternalError)
    cls = base if kind is None else error_class(kind, base)
    return cls(message, field=field, stage=stage)


def from_kind(kind: str, message: str, field: str | None = None) -> OmniError:
    """The domain error a REST error body names (its `code`); a kind this version does not know is
    an OmniError that keeps it (`error_class`), so a newer server's errors still reach the caller
    typed as errors."""
    return error_class(kind)(message, field=field)
