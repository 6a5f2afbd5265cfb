"""Transport security shared by the stages, the gateway and the launcher: TLS/mTLS credentials built
from certificate paths, and the bearer API key of the gateway's public faces.

Everything is optional: with no certificate paths every port and channel stays plaintext (loopback,
a service mesh or a trusted network), and with no API key the public API is open.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path

import grpc

from omnistream.request.errors import Unauthenticated
from omnistream.service.ports import bind_error, port_in_use
from omnistream.service.server import STAGE_ORIGIN, abort_with

AUTHORIZATION_METADATA_KEY = "authorization"


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def server_credentials(
    cert: str | None, key: str | None, client_ca: str | None = None
) -> grpc.ServerCredentials | None:
    """TLS for a gRPC port, or None (plaintext) when no certificate is given.

    With `client_ca` every client must present a certificate signed by that CA (mutual TLS).
    """
    if not cert and not key:
        if client_ca:
            raise ValueError("a client CA (mTLS) needs a server certificate and key too")
        return None
    if not (cert and key):
        raise ValueError("TLS needs both a certificate and its private key")
    return grpc.ssl_server_credentials(
        [(_read(key), _read(cert))],
        root_certificates=_read(client_ca),
        require_client_auth=bool(client_ca),
    )


def channel_credentials(
    ca: str | None = None, cert: str | None = None, key: str | None = None
) -> grpc.ChannelCredentials | None:
    """Client TLS for a channel, or None (plaintext) when nothing is given.

    `ca` verifies the server (None: the system's roots); `cert` + `key` are this side's client
    certificate, for servers that require one (mTLS).
    """
    if not (ca or cert or key):
        return None
    if bool(cert) != bool(key):
        raise ValueError("a client certificate needs its private key (and the other way round)")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca), private_key=_read(key), certificate_chain=_read(cert)
    )


def add_port(
    server: grpc.aio.Server,
    address: str,
    credentials: grpc.ServerCredentials | None,
    flag: str = "--port",
) -> int:
    """Bind `address` with TLS when `credentials` are given; returns the bound port.

    A port that is taken raises BindError naming it and `flag` (the option that sets it), checked
    before gRPC tries: gRPC's own failure is a bare RuntimeError plus core log lines on stderr.
    """
    host, _, port = address.rpartition(":")
    if port.isdigit() and port_in_use(host, int(port)):
        raise bind_error(address, flag)
    try:
        bound: int  # grpc is untyped here: its calls are Any
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
        return bound
    except RuntimeError as exc:  # lost a race since the check, or an address that cannot be bound
        raise bind_error(address, flag) from exc


def open_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, int | str]] = (),
    server_name: str | None = None,
) -> grpc.aio.Channel:
    """An aio channel, TLS when `credentials` are given. `server_name` is the name the server's
    certificate is checked against when it differs from the host dialled (an address found by DNS)."""
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    opts = list(options)
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return grpc.aio.secure_channel(address, credentials, options=opts)


def bearer_matches(header: str | None, api_key: str) -> bool:
    """`Authorization: Bearer <api_key>` (scheme case-insensitive), compared in constant time."""
    if not header:
        return False
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), api_key.encode())


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped (Any)
    """Require `authorization: Bearer <api_key>` metadata on the methods under `prefixes`.

    Other services on the same port (health, reflection) stay open, so probes need no key.
    A call without the key fails with UNAUTHENTICATED before its handler runs.
    """

    def __init__(self, api_key: str, prefixes: Iterable[str], origin: str = STAGE_ORIGIN) -> None:
        """`origin`: who the refusal says sent it (`abort_with`'s status-origin marker)."""
        if not api_key:
            raise ValueError("empty API key")
        self.api_key = api_key
        self.prefixes = tuple(prefixes)
        self.origin = origin

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self.prefixes):
            return handler
        metadata = handler_call_details.invocation_metadata or ()
        header = next((v for k, v in metadata if k == AUTHORIZATION_METADATA_KEY), None)
        if isinstance(header, bytes):
            header = header.decode(errors="replace")
        if bearer_matches(header, self.api_key):
            return handler
        return _refusing_handler(handler, Unauthenticated("missing or invalid API key"), self.origin)


def _refusing_handler(
    handler: grpc.RpcMethodHandler, error: Unauthenticated, origin: str
) -> grpc.RpcMethodHandler:
    async def refuse(_request: object, context: grpc.aio.ServicerContext) -> None:
        await abort_with(context, error, origin)

    if handler.request_streaming and handler.response_streaming:
        make = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        make = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        make = grpc.unary_stream_rpc_method_handler
    else:
        make = grpc.unary_unary_rpc_method_handler
    return make(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
