"""Python clients of the omnistream gateway.

    from omnistream.client import Client

    with Client("127.0.0.1:50051") as client:
        for event in client.generate("Tell me a story", seed=7):
            ...  # TextDelta, AudioChunk (float32 numpy + sample rate), Usage, End

`AsyncClient` is the asyncio twin; `RestClient`/`AsyncRestClient` speak REST/SSE for callers that can
reach only HTTP. Errors are the project's typed errors (`omnistream.request.errors`): `DeadlineExceeded`,
`Overloaded` (with `retry_after`), `Unavailable`, `InvalidRequest` (with `field`), `Unauthenticated`,
each with the gRPC `code` (or `http_status`) and the server's error `kind`.
"""

from omnistream.wire.protogen import ensure_generated

ensure_generated()  # a checkout run without `make setup` still gets its stubs

from omnistream.client.aio import AsyncClient  # noqa: E402  (the stubs exist from here on)
from omnistream.client.connection import Connection  # noqa: E402
from omnistream.client.events import AudioChunk, End, Event, Result, TextDelta, Usage  # noqa: E402
from omnistream.client.request import build_request, media  # noqa: E402
from omnistream.client.rest import AsyncRestClient, RestClient  # noqa: E402
from omnistream.client.sync import Client  # noqa: E402
from omnistream.request.errors import (  # noqa: E402
    Cancelled,
    DeadlineExceeded,
    InvalidRequest,
    OmniError,
    Overloaded,
    TooLarge,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "AsyncClient",
    "AsyncRestClient",
    "AudioChunk",
    "Cancelled",
    "Client",
    "Connection",
    "DeadlineExceeded",
    "End",
    "Event",
    "InvalidRequest",
    "OmniError",
    "Overloaded",
    "RestClient",
    "Result",
    "TextDelta",
    "TooLarge",
    "Unauthenticated",
    "Unavailable",
    "Usage",
    "build_request",
    "media",
]
