"""How the gateway reads a failed call to a stage: the domain error, with the stage it came from.

A status the stage sent itself is rebuilt as it is; a status gRPC made on this side because the link
broke is the stage being unavailable (the client may retry, the replica leaves the rotation, and a
request with no output yet moves to another replica).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

import grpc

from omnistream.request.errors import OmniError, Unavailable, from_grpc
from omnistream.service.server import (
    ERROR_FIELD_METADATA_KEY,
    ERROR_KIND_METADATA_KEY,
    STAGE_ORIGIN,
    STATUS_ORIGIN_METADATA_KEY,
)

# What gRPC reports when the link broke and no status came from the stage: UNAVAILABLE (reset, peer
# gone, keepalive timeout), INTERNAL "Internal error from Core" (the transport broke under a read or
# write, grpc/grpc#36066), UNKNOWN or CANCELLED (an RST_STREAM the stage's code never sent).
_codes = grpc.StatusCode
LINK_FAILURE_CODES = frozenset({_codes.UNAVAILABLE, _codes.INTERNAL, _codes.UNKNOWN, _codes.CANCELLED})


def stage_error(
    stage: str,
    code: grpc.StatusCode,
    details: str | None,
    trailing_metadata: Iterable[tuple[str, str | bytes]] | None = None,
) -> OmniError:
    """The domain error for a failed call to `stage`, built with its `stage`.

    A status the stage sent itself carries its marker (`omni-status-origin: stage`, set by
    `abort_with`; a stage from before the marker sent its error kind alone) and is rebuilt as it is:
    the stage's own INTERNAL stays an engine bug. Without the marker the status was made by gRPC on
    this side, so a broken link is the stage being unavailable, whatever code gRPC chose: the client
    may retry, the replica leaves the rotation, and a request with no output yet moves to another
    replica (GatewayCore.open). Unmarked codes a broken link never makes (this side's deadline or
    message limit) keep their meaning.
    """
    metadata = {key: value for key, value in trailing_metadata or ()}
    kind = metadata.get(ERROR_KIND_METADATA_KEY)
    origin = metadata.get(STATUS_ORIGIN_METADATA_KEY)
    sent_by_stage = origin == STAGE_ORIGIN or (origin is None and kind is not None)
    # `stage`: the gateway takes a failed replica of it out of rotation.
    if not sent_by_stage and code in LINK_FAILURE_CODES:
        return Unavailable(f"{stage}: connection to the stage lost ({code.name}: {details})", stage=stage)
    field = metadata.get(ERROR_FIELD_METADATA_KEY) if sent_by_stage else None  # the client's param
    return from_grpc(
        code,
        f"{stage}: {details}",
        kind=str(kind) if sent_by_stage and kind is not None else None,  # names the error's class
        field=str(field) if field else None,
        stage=stage,
    )


def grpc_error(exc: grpc.aio.AioRpcError, stage: str) -> OmniError:
    """`stage_error` for a raised call error."""
    return stage_error(stage, exc.code(), exc.details(), exc.trailing_metadata())


@contextlib.asynccontextmanager
async def calls_to(stage: str, call: grpc.aio.Call | None, moot_once_ok: bool = True) -> AsyncIterator[None]:
    """Name `stage` in a call error raised inside (a write to one stage from another's pump). A
    write to a call that has already ended raises no status of its own ("RPC already finished"):
    the call's own status is raised instead (a link cut ends the call before the write: its
    UNAVAILABLE); with `moot_once_ok`, a write to a call that ended by itself is moot."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise grpc_error(exc, stage) from None
    except asyncio.InvalidStateError:
        if call is None or not call.done():
            raise
        code = await call.code()
        if code == grpc.StatusCode.OK:
            if moot_once_ok:
                return
            raise
        raise stage_error(stage, code, await call.details(), await call.trailing_metadata()) from None
