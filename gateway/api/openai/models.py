"""`GET /v1/models`: the served model, as the stages described it in their Info.

The gateway reads nothing from a checkpoint, so the list is empty until a replica has joined.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.serving.core import GatewayCore


def router(core: GatewayCore) -> APIRouter:
    """The endpoint over `core`'s deployment (gateway/cluster/deployment.py)."""
    api = APIRouter()

    @api.get("/v1/models", summary="The served model, as the stages describe it (empty until they did)")
    async def models() -> dict[str, Any]:
        card = core.deployment.model_card()
        return {"object": "list", "data": [card] if card else []}

    return api
