"""The asyncio client of the gateway's gRPC API (`omni.v1.Gateway`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from omnistream.client.connection import Connection
from omnistream.client.events import Event, Result
from omnistream.client.request import Messages, build_request
from omnistream.client.wire import retryable, to_error, to_event
from omnistream.proto.omni.v1 import gateway_pb2, gateway_pb2_grpc


class AsyncClient:
    """One channel to a gateway; use it as `async with AsyncClient("host:port") as client:`.

    `generate(...)` streams typed events; leaving the loop early (break, an exception, cancelling the
    task) cancels the request in every stage: wrap it in `contextlib.aclosing` for that to happen at
    once rather than when the generator is collected. Keyword arguments are those of
    `omnistream.client.request.build_request`; `deadline` (seconds) bounds the whole call on the
    client's side, `timeout` is the gateway's own request timeout.
    """

    def __init__(self, target: str | Connection, **connection: Any) -> None:
        self.connection = target if isinstance(target, Connection) else Connection(target, **connection)
        c = self.connection
        credentials = c.credentials()
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(c.target, options=c.options())
        else:
            self._channel = grpc.aio.secure_channel(c.target, credentials, options=c.options())
        self._stub = gateway_pb2_grpc.GatewayStub(self._channel)  # type: ignore[no-untyped-call]  # grpc's stubs are untyped

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def info(self, deadline: float | None = 10.0) -> gateway_pb2.GatewayInfo:
        """What the deployment serves (model, voices, sample rate), as its stages said."""
        try:
            info: gateway_pb2.GatewayInfo = await self._stub.Info(
                gateway_pb2.GatewayInfoRequest(), timeout=deadline, metadata=self.connection.metadata()
            )
            return info
        except grpc.aio.AioRpcError as exc:
            raise to_error(exc.code(), exc.details(), exc.trailing_metadata()) from None

    async def generate(
        self, messages: Messages | None = None, *, deadline: float | None = None, **options: Any
    ) -> AsyncIterator[Event]:
        request = build_request(messages, **options)
        c = self.connection
        attempt = 0
        while True:
            call = self._stub.Generate(request, timeout=deadline, metadata=c.metadata())
            received = False
            try:
                async for message in call:
                    event = to_event(message)
                    if event is not None:
                        received = True
                        yield event
                return
            except grpc.aio.AioRpcError as exc:
                error = to_error(exc.code(), exc.details(), exc.trailing_metadata())
                if received or attempt >= c.retries or not retryable(error):
                    raise error from None
                await asyncio.sleep(c.backoff(attempt, error.retry_after))  # type: ignore[attr-defined]
                attempt += 1
            finally:
                call.cancel()  # a no-op once the call ended; otherwise the request stops everywhere

    async def complete(self, messages: Messages | None = None, **options: Any) -> Result:
        """The whole answer: text, audio (float32 at its sample rate), usage, finish reason."""
        result = Result()
        async for event in self.generate(messages, **options):
            result.add(event)
        return result
