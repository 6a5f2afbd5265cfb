"""Serves the playground page at `/` and `/playground`, and its files under `/playground/static/`.

The files ship inside the package (package-data), so an installed gateway serves the same page as a
checkout. Nothing here needs the API key: the page itself is public and asks the user for the key,
which it then sends only to the API (`/v1/...`), so the middleware that guards `/v1/` is unchanged.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_PREFIX = "/playground/static"

# The page is re-read on every request and never cached, so a new version shows on reload; the
# modules it loads are small and also revalidated (no hashed names without a build step).
NO_CACHE = {"Cache-Control": "no-cache"}


def register(app: FastAPI) -> None:
    """Add the page's routes to the gateway's REST app (one call from `gateway.api.app.build_app`)."""

    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=NO_CACHE)

    for path in ("/", "/playground"):
        app.add_api_route(path, page, methods=["GET"], include_in_schema=False)
    app.mount(STATIC_PREFIX, StaticFiles(directory=STATIC_DIR), name="playground-static")
