"""Where and how a client connects: address, TLS, API key, message size, retries."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from omnistream.service.security import AUTHORIZATION_METADATA_KEY
from omnistream.wire.limits import MAX_MESSAGE_BYTES

API_KEY_ENV = "OMNISTREAM_API_KEY"


@dataclass(frozen=True)
class Connection:
    """`target`: "host:port" of the gateway's gRPC port. TLS when `tls` or any certificate is given
    (`ca`: the CA to trust, default the system's; `cert`/`key`: a client certificate for mTLS).
    `api_key` (default $OMNISTREAM_API_KEY) is sent as `authorization: Bearer <key>`. `retries`:
    how often a request is sent again when the gateway refused it before any event (unavailable,
    overloaded), waiting its retry-after (at most `max_backoff` seconds)."""

    target: str
    api_key: str | None = None
    tls: bool = False
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None
    max_message_bytes: int = MAX_MESSAGE_BYTES
    retries: int = 2
    max_backoff: float = 5.0

    def credentials(self) -> grpc.ChannelCredentials | None:
        if not (self.tls or self.ca or self.cert):
            return None
        if bool(self.cert) != bool(self.key):
            raise ValueError("cert and key go together")

        def read(p: str | None) -> bytes | None:
            return Path(p).read_bytes() if p else None

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))

    def options(self) -> list[tuple[str, int | str]]:
        options: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.enable_retries", 0),  # retries are this client's, and only before the first event
        ]
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return options

    def metadata(self) -> tuple[tuple[str, str], ...]:
        key = self.api_key or os.environ.get(API_KEY_ENV)
        return ((AUTHORIZATION_METADATA_KEY, f"Bearer {key}"),) if key else ()

    def backoff(self, attempt: int, retry_after: float | None) -> float:
        wait = retry_after if retry_after is not None else 0.2 * 2**attempt
        return min(max(wait, 0.0), self.max_backoff)
