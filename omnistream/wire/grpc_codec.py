"""Registering gRPC services so that malformed request bytes are a client error, not UNKNOWN.

grpc.aio parses each request before the handler sees it; a deserializer that raises turns into
status UNKNOWN ("Unexpected DecodeError ...") outside any code of ours. Instead, requests are parsed
here into either the message or a `Malformed` marker, and `parsed()` raises `InvalidRequest` for the
marker where the handler reads it, so it surfaces as INVALID_ARGUMENT through the one error table
and inside the handler's own cleanup.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from omnistream.request.errors import InvalidRequest


@dataclass(frozen=True)
class Malformed:
    """Bytes that did not parse as the expected message."""

    type_name: str
    reason: str

    def error(self) -> InvalidRequest:
        return InvalidRequest(f"malformed {self.type_name} message: {self.reason}", field="message")


def _tolerant(message_type: type[Message]) -> Callable[[bytes], Message | Malformed]:
    name = message_type.DESCRIPTOR.full_name

    def parse(data: bytes) -> Message | Malformed:
        try:
            return message_type.FromString(data)
        except (DecodeError, RuntimeError, ValueError) as exc:  # upb raises DecodeError; be generous
            return Malformed(name, str(exc) or type(exc).__name__)

    return parse


def checked(message: Any) -> Any:
    """The message itself, or InvalidRequest when it did not parse."""
    if isinstance(message, Malformed):
        raise message.error()
    return message


async def parsed(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Iterate a request stream, raising InvalidRequest at the first malformed message."""
    async for message in requests:
        yield checked(message)


@dataclass(frozen=True)
class Method:
    name: str
    behavior: Callable[..., Any]
    request_type: type[Message]
    response_type: type[Message]
    kind: str = "stream_stream"  # or "unary_stream", "unary_unary"


def add_service(server: grpc.aio.Server, service_full_name: str, methods: list[Method]) -> None:
    """Register `methods` under `service_full_name` with tolerant request parsing."""
    factories = {
        "stream_stream": grpc.stream_stream_rpc_method_handler,
        "unary_stream": grpc.unary_stream_rpc_method_handler,
        "unary_unary": grpc.unary_unary_rpc_method_handler,
    }
    handlers = {
        m.name: factories[m.kind](
            m.behavior,
            request_deserializer=_tolerant(m.request_type),
            response_serializer=m.response_type.SerializeToString,
        )
        for m in methods
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service_full_name, handlers),))
