"""The API key: a bearer token every `/v1/` request must carry when the gateway has one.

Only the API needs it: the probes (`/health`, `/ready`), `/metrics` and the playground page stay
open (the page asks the user for the key and sends it only to `/v1/`). The WebSocket route checks
the same key itself (gateway/realtime/server.py): HTTP middleware does not see WebSocket scopes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from gateway.api.openai.errors import error_body
from omnistream.request.errors import Unauthenticated
from omnistream.service.security import bearer_matches


def require_api_key(app: FastAPI, api_key: str) -> None:
    """Refuse a `/v1/` request without `Authorization: Bearer <api_key>` with OpenAI's 401 body."""

    @app.middleware("http")
    async def check(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path.startswith("/v1/") and not bearer_matches(
            request.headers.get("authorization"), api_key
        ):
            error = Unauthenticated("missing or invalid API key (Authorization: Bearer <key>)")
            return JSONResponse(
                error_body(401, error.message, error.kind, None),
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await call_next(request)
