"""Checks on raw REST input that come before (body size) or beside (Unicode) field validation.

Both exist so that bad input gets a 4xx instead of failing deeper down: a body over the limit
would otherwise be read whole into memory and then break the 16 MiB stage message limit (an
internal error from the thinker), and a lone surrogate ("\\ud800", legal JSON, not encodable as
UTF-8) would fail only when the protobuf message or the SSE stream is encoded (a 500, or a stream
cut in the middle).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnistream.request.errors import TooLarge

Path = tuple[str | int, ...]


# --- Unicode ---------------------------------------------------------------------------------------
def is_valid_unicode(text: str) -> bool:
    """False for strings UTF-8 cannot encode (lone surrogates are the only such code points)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def first_invalid_unicode(value: Any) -> Path | None:
    """The path (as pydantic locations: keys and list indexes) of a string in a parsed JSON value,
    object keys included, that is not valid Unicode; None when every string is.

    Iterative, so a deeply nested body cannot exhaust the interpreter's recursion limit, and each
    entry links to its parent instead of copying its path, so the walk stays linear in the body.
    """
    stack: list[tuple[_Link, Any]] = [(None, value)]
    while stack:
        link, item = stack.pop()
        if isinstance(item, str):
            if not is_valid_unicode(item):
                return _path(link)
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if isinstance(key, str) and not is_valid_unicode(key):
                    return _path((link, key))
                stack.append(((link, key), child))
        elif isinstance(item, list):
            stack.extend(((link, i), child) for i, child in reversed(list(enumerate(item))))
    return None


_Link = tuple[Any, str | int] | None  # (parent link, key or index); None at the root


def _path(link: _Link) -> Path:
    keys: list[str | int] = []
    while link is not None:
        link, key = link
        keys.append(key)
    return tuple(reversed(keys))


def printable(text: str) -> str:
    """`text` with lone surrogates written as backslash escapes, so an error message or field name
    that quotes bad input can itself always be encoded (error bodies must stay valid JSON)."""
    return text if is_valid_unicode(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


# --- body size -------------------------------------------------------------------------------------
class BodyTooLarge(HTTPException):
    """Raised from `receive` when the body passes the limit. An HTTPException on purpose: FastAPI
    re-raises those from its body reading (anything else becomes a 400), so the app's handler for
    this class answers 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(status_code=413, detail=too_large_message(limit))
        self.error = TooLarge(self.detail)


def too_large_message(limit: int) -> str:
    return f"the request body is over {limit} bytes (the gateway's max_request_bytes)"


ErrorResponder = Callable[[TooLarge], Callable[[Scope, Receive, Send], Awaitable[None]]]


class BodyLimit:
    """Pure ASGI middleware: a request body over `limit` bytes gets 413 without being read.

    A declared Content-Length over the limit is answered at once; a chunked (or lying) body is
    counted as the application reads it and fails with `BodyTooLarge` as soon as it passes the limit,
    so at most `limit` bytes plus one chunk are ever held. `respond` builds the JSON error response.
    """

    def __init__(self, app: ASGIApp, limit: int, respond: ErrorResponder) -> None:
        self.app = app
        self.limit = limit
        self.respond = respond

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await self.respond(BodyTooLarge(self.limit).error)(scope, receive, send)
            return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except BodyTooLarge as exc:  # only when no handler inside the app answered it
            if started:
                raise
            await self.respond(exc.error)(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    """The declared body size; None when absent or unreadable (then counting alone applies)."""
    value = Headers(scope=scope).get("content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
