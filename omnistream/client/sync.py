"""The blocking client of the gateway's gRPC API, for scripts and notebooks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc

from omnistream.client.connection import Connection
from omnistream.client.events import Event, Result
from omnistream.client.request import Messages, build_request
from omnistream.client.wire import retryable, to_error, to_event
from omnistream.proto.omni.v1 import gateway_pb2, gateway_pb2_grpc


class Client:
    """One channel to a gateway; use it as `with Client("host:port") as client:`.

    `generate(...)` yields typed events; leaving the loop early (break, an exception) closes the
    generator, which cancels the request in every stage. Arguments as `AsyncClient.generate`.
    """

    def __init__(self, target: str | Connection, **connection: Any) -> None:
        self.connection = target if isinstance(target, Connection) else Connection(target, **connection)
        c = self.connection
        credentials = c.credentials()
        if credentials is None:
            self._channel = grpc.insecure_channel(c.target, options=c.options())
        else:
            self._channel = grpc.secure_channel(c.target, credentials, options=c.options())
        self._stub = gateway_pb2_grpc.GatewayStub(self._channel)  # type: ignore[no-untyped-call]  # grpc's stubs are untyped

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def info(self, deadline: float | None = 10.0) -> gateway_pb2.GatewayInfo:
        try:
            info: gateway_pb2.GatewayInfo = self._stub.Info(
                gateway_pb2.GatewayInfoRequest(), timeout=deadline, metadata=self.connection.metadata()
            )
            return info
        except grpc.RpcError as exc:
            raise to_error(exc.code(), exc.details(), exc.trailing_metadata()) from None

    def generate(
        self, messages: Messages | None = None, *, deadline: float | None = None, **options: Any
    ) -> Iterator[Event]:
        request = build_request(messages, **options)
        c = self.connection
        attempt = 0
        while True:
            call = self._stub.Generate(request, timeout=deadline, metadata=c.metadata())
            received = False
            try:
                for message in call:
                    event = to_event(message)
                    if event is not None:
                        received = True
                        yield event
                return
            except grpc.RpcError as exc:
                error = to_error(exc.code(), exc.details(), exc.trailing_metadata())
                if received or attempt >= c.retries or not retryable(error):
                    raise error from None
                time.sleep(c.backoff(attempt, error.retry_after))  # type: ignore[attr-defined]
                attempt += 1
            finally:
                call.cancel()

    def complete(self, messages: Messages | None = None, **options: Any) -> Result:
        result = Result()
        for event in self.generate(messages, **options):
            result.add(event)
        return result
