"""The gateway's HTTP app, assembled from the endpoints' routers over one `GatewayCore`.

Each endpoint is its own module with its own `APIRouter` (gateway/api/openai/: chat, speech,
transcriptions, models; gateway/api/probes.py), as vLLM's entrypoints are; this module only puts
them together with what is the app's rather than any one route's: the API key, the error table's
exception handlers, the body limit, the realtime WebSocket and the playground page.
"""

from __future__ import annotations

import inspect
from typing import Any

from fastapi import FastAPI

from gateway.api import probes
from gateway.api.auth import require_api_key
from gateway.api.openai import chat, models, speech, transcriptions
from gateway.api.openai.errors import add_error_handlers, error_response
from gateway.api.openai.request_guards import BodyLimit
from gateway.playground import routes as playground
from gateway.realtime.server import add_realtime_route
from gateway.serving.core import GatewayCore

# FastAPI's own OpenTelemetry (newer FastAPI: a span per HTTP request, WebSocket and dependency, as
# soon as a tracer provider is installed) stays off: the gateway's spans are one SERVER span per
# request on every face, REST, gRPC and realtime alike (gateway/serving/tracing.py), and probes and
# /metrics scrapes make none.
NATIVE_TELEMETRY_OFF = {"tracing": False, "metrics": False, "logs": False}


def _fastapi(**kwargs: Any) -> FastAPI:
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        kwargs["telemetry"] = NATIVE_TELEMETRY_OFF
    return FastAPI(**kwargs)


def build_app(core: GatewayCore) -> FastAPI:
    """The app serving `core` on the HTTP port."""
    app = _fastapi(
        title="omnistream gateway",
        version="0.1.0",
        description="OpenAI-compatible chat completions with streamed text and audio (Qwen3-Omni).",
    )
    if core.config.api_key:
        require_api_key(app, core.config.api_key)
    add_error_handlers(app)
    app.include_router(probes.router(core))
    app.include_router(models.router(core))
    app.include_router(chat.router(core))
    app.include_router(speech.router(core))
    app.include_router(transcriptions.router(core))
    add_realtime_route(app, core)  # /v1/realtime (WebSocket), gateway/realtime/
    playground.register(app)
    # Added last, so it runs first: an oversize body is refused before anything reads it.
    app.add_middleware(BodyLimit, limit=core.config.max_request_bytes, respond=error_response)
    return app
