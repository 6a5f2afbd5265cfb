"""The REST API's errors: OpenAI's error body for every non-2xx answer, from the one error table.

Domain errors (`omnistream.request.errors`), pydantic validation errors and Starlette's own HTTP errors all
become `{"error": {"message", "type", "param", "code"}}` here, so no path answers in another shape;
`add_error_handlers` installs that table on the app (exception handlers are the app's, not a
router's, so every endpoint and the middleware answer through the same one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.admission.permits import Rejected
from gateway.api.openai.content import PART_TAGS
from gateway.api.openai.messages import ROLE_TAGS
from gateway.api.openai.request_guards import BodyTooLarge, printable
from omnistream.request.errors import InternalError, InvalidRequest, OmniError, Unavailable, status_of

# Tags of the message and content unions: pydantic puts them in error locations, `param` leaves them out.
UNION_TAGS = frozenset({"<string>", "<parts>"}) | PART_TAGS | ROLE_TAGS

_TYPES = {
    401: "authentication_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout",
}
# Codes for the statuses Starlette/FastAPI raise themselves (unknown path, wrong method, ...).
_HTTP_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, rate_limit_error, ...")
    param: str | None = Field(None, description="The field at fault, as a path (messages.0.content)")
    code: str = Field(description="The error kind (invalid_request, request_too_large, ...)")


class ErrorResponse(BaseModel):
    """Every non-2xx answer of the API has this body (OpenAI's error format)."""

    error: ErrorDetail


# The failures every endpoint documents alike in its OpenAPI responses (each adds its own 4xx).
COMMON_RESPONSES: dict[int | str, dict[str, object]] = {
    429: {"model": ErrorResponse, "description": "Overloaded (see Retry-After)"},
    503: {"model": ErrorResponse, "description": "No healthy replica"},
    504: {"model": ErrorResponse, "description": "Timed out (the request's `timeout`)"},
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_body(status: int, message: str, kind: str, param: str | None) -> dict[str, Any]:
    # Messages and field names may quote the client's input: escape what UTF-8 cannot carry.
    return {
        "error": {
            "message": printable(message),
            "type": error_type(status),
            "param": printable(param) if param is not None else None,
            "code": kind,
        }
    }


def error_response(exc: OmniError) -> JSONResponse:
    status = status_of(exc).http_status
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, Rejected) else None
    return JSONResponse(
        error_body(status, exc.message, exc.kind, exc.field), status_code=status, headers=headers
    )


FIELD_NAMES = {"voice": "audio.voice", "speaker": "audio.voice"}


def from_validation_errors(errors: Sequence[Any]) -> InvalidRequest:
    """The first FastAPI/pydantic validation error as the domain error, its location as `param`."""
    if not errors:
        return InvalidRequest("invalid request")
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    if loc[:1] == ("body",):
        loc = loc[1:]
    if first.get("type") == "json_invalid":  # its loc is a character offset, not a field
        detail = (first.get("ctx") or {}).get("error", "decode error")
        offset = f" at character {loc[0]}" if loc else ""
        return InvalidRequest(f"the request body is not valid JSON: {detail}{offset}")
    param = ".".join(str(p) for p in loc if p not in UNION_TAGS) or None
    if param is None:
        return InvalidRequest(
            "the request body must be a JSON object (Content-Type: application/json): "
            f"{first.get('msg', 'invalid request')}"
        )
    return InvalidRequest(f"{param}: {first.get('msg', 'invalid value')}", field=param)


def from_http_exception(exc: StarletteHTTPException) -> tuple[int, dict[str, Any]]:
    """Status and OpenAI-style body for an HTTPException raised by Starlette or FastAPI."""
    # FastAPI answers a body its JSON parser fails on with a bare 400 (save for syntax errors): bytes
    # that are not UTF-8, nesting past the parser's recursion limit, an integer of over 4,300 digits.
    # Those are plain bad input and get the API's usual 422.
    cause = exc.__cause__
    if exc.status_code == 400 and isinstance(cause, ValueError | RecursionError):
        if isinstance(cause, UnicodeDecodeError):
            message = "the request body is not valid UTF-8"
        elif isinstance(cause, RecursionError):
            message = "the request body is nested too deeply"
        else:
            message = f"the request body is not valid JSON: {cause}"
        return 422, error_body(422, message, InvalidRequest.kind, None)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    return exc.status_code, error_body(exc.status_code, str(exc.detail), code, None)


def unavailable() -> OmniError:
    """The 503 of a gateway that can serve nothing now (no thinker in rotation)."""
    return Unavailable("no thinker replica is ready: nothing can be served now")


def add_error_handlers(app: FastAPI) -> None:
    """Every error the app can meet answers with OpenAI's error body (see the module doc)."""

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(from_validation_errors(exc.errors()))

    @app.exception_handler(BodyTooLarge)
    async def on_body_too_large(_: Request, exc: BodyTooLarge) -> JSONResponse:
        return error_response(exc.error)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        status, body = from_http_exception(exc)
        return JSONResponse(body, status_code=status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: still a JSON body, without internals (Starlette logs the traceback).
        error = InternalError(f"internal error ({type(exc).__name__})")
        return JSONResponse(error_body(500, error.message, error.kind, None), status_code=500)

    @app.exception_handler(OmniError)
    async def on_omni_error(_: Request, exc: OmniError) -> JSONResponse:
        if exc.field in FIELD_NAMES:
            exc.field = FIELD_NAMES[exc.field]
        return error_response(exc)
