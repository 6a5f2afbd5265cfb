"""Server-sent events as OpenAI's streaming endpoints write them, and the response that carries a
session's stream.

Every streamed answer (chat chunks, speech deltas, a mid-stream error) is one `data: <json>` event;
chat streams end with `data: [DONE]`. `SessionStream` is shared by every streamed body (SSE or a
file's bytes): it is what guarantees that a session's permit is returned however the client leaves.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fastapi.responses import StreamingResponse

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from gateway.serving.session import Session

DONE = "data: [DONE]\n\n"  # the end of a chat stream (OpenAI's sentinel)


def event(body: dict[str, Any], *, ascii_only: bool = True) -> str:
    """One SSE event holding `body` as JSON. `ascii_only=False` keeps text as UTF-8 (chat chunks:
    a delta's characters are sent as they are, not as \\u escapes)."""
    return f"data: {json.dumps(body, ensure_ascii=ascii_only)}\n\n"


class SessionStream(StreamingResponse):
    """A streamed answer that always ends its session: the body's generator closes it when it runs,
    but a client that leaves before the first byte is sent cancels the response before the generator
    ever starts, and an unstarted generator runs no `finally` (the admission permit would leak)."""

    def __init__(self, session: Session, content: Any, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.session = session

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.session.aclose()
