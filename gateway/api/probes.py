"""`GET /health`, `/ready` and `/metrics`: what a process manager, a load balancer and Prometheus ask.

Outside `/v1/`, so they need no API key (gateway/api/auth.py); `/ready` is per need
(gateway/cluster/readiness.py): 200 while anything (at least text) can be served, with what
each kind of request lacks and every replica's state.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.api.openai.errors import error_body, unavailable
from gateway.serving.core import GatewayCore


def router(core: GatewayCore) -> APIRouter:
    """The three probes over `core`."""
    api = APIRouter()

    @api.get("/health", summary="The process is alive")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @api.get(
        "/ready",
        summary="What can be served: text (a thinker) and audio (thinker, talker, code2wav)",
        responses={503: {"description": "nothing can be served (no thinker)"}},
    )
    async def ready() -> JSONResponse:
        readiness = core.readiness
        body: dict[str, Any] = {**readiness.body(), "stages": core.replicas.snapshot()}
        if not readiness.ready:
            body |= error_body(503, unavailable().message, "unavailable", None)
        return JSONResponse(body, status_code=200 if readiness.ready else 503)

    @api.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def metrics() -> Response:
        return Response(generate_latest(core.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return api
