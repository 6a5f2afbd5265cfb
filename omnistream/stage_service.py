"""What every stage service shares: stream bookkeeping in the servicer, and the process bootstrap.

Servicers stay thin (proto <-> domain, validation, cancellation); engines know nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc

from omnistream.chunk_key import ChunkKey, SequenceChecker, Stage, validate_request_id
from omnistream.convert import plan_from_fields
from omnistream.engine import Engine, OutputStream
from omnistream.errors import InvalidRequest, OmniError, Unavailable
from omnistream.metrics import StageMetrics
from omnistream.proto.omni.v1 import common_pb2
from omnistream.security import add_port, server_credentials
from omnistream.server import (
    abort_with,
    add_health_and_reflection,
    build_server,
    serve_until_signal,
    set_serving,
    start_metrics_http,
)

log = logging.getLogger(__name__)

INPUT_DRAIN_SECONDS = 10.0  # how long a finished stream waits for the client to half-close

MODES = {
    common_pb2.MODE_UNSPECIFIED: "async",
    common_pb2.MODE_ASYNC_CHUNK: "async",
    common_pb2.MODE_SEQUENTIAL: "sequential",
}


class StageServicer:
    """Base of the three servicers: draining, metrics, the input pump, error mapping."""

    stage: Stage
    input_stage: Stage  # the stage whose output this service consumes (keys of incoming chunks)

    def __init__(self, engine: Engine, metrics: StageMetrics) -> None:
        self.engine = engine
        self.metrics = metrics
        self.draining = False
        self.open_streams = 0

    async def _first(self, requests: AsyncIterator, context: grpc.aio.ServicerContext):
        if self.draining:
            await abort_with(context, Unavailable(f"{self.stage.value} is draining"))
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            await abort_with(context, InvalidRequest("the stream ended before its open message"))
        if first.WhichOneof("kind") != "open":
            await abort_with(
                context, InvalidRequest("the first message of a stream must be `open`", field="open")
            )
        return first

    @contextlib.contextmanager
    def chunk_cpu(self, direction: str):
        """Thread CPU time of turning one chunk into engine input ("in") or into a message ("out")."""
        started = time.thread_time()
        try:
            yield
        finally:
            self.metrics.chunk_cpu.labels(stage=self.stage.value, direction=direction).observe(
                time.thread_time() - started
            )

    async def _reject(self, context: grpc.aio.ServicerContext, error: OmniError) -> None:
        """Refuse a stream at its open message (bad parameters, engine full)."""
        self.metrics.error(error.kind)
        await abort_with(context, error)

    def _open_streaming(self, open_, key: common_pb2.ChunkKey):
        """The fields talker and code2wav opens share: (request id, input checker, mode, chunk plan)."""
        rid = validate_request_id(open_.request_id)
        checker = self._checker(rid, key)
        mode = MODES.get(open_.mode)
        if mode is None:
            raise InvalidRequest("unknown mode", field="mode")
        plan = plan_from_fields(open_.initial_chunk_frames, open_.chunk_frames, open_.left_context_frames)
        return rid, checker, mode, plan

    def _checker(self, request_id: str, key: common_pb2.ChunkKey) -> SequenceChecker:
        checker = SequenceChecker(request_id, self.input_stage)
        checker.expect(key)  # the open message is chunk 0
        return checker

    async def _pump(
        self,
        requests: AsyncIterator,
        checker: SequenceChecker,
        out: OutputStream,
        handle: Callable[[object], bool],
        output_done: asyncio.Event,
    ) -> None:
        """Read input chunks until the one marked last; any problem fails the request's output.

        Once this stage's output is complete (codec EOS before the thinker ended, say) the rest of
        the input is read and dropped: the RPC closes only after the client half-closes, so a
        client write never races the end of the call.
        """
        try:
            finished = False
            async for message in requests:
                if output_done.is_set():
                    continue
                if finished:
                    raise InvalidRequest(
                        f"chunk {ChunkKey.from_proto(message.key)} arrived after the last one"
                    )
                checker.expect(message.key)
                if message.WhichOneof("kind") != "input":
                    raise InvalidRequest("only the first message may be `open`", field="open")
                self.metrics.chunks_in.inc()
                with self.chunk_cpu("in"):
                    finished = handle(message.input)
            if not finished:
                raise InvalidRequest(
                    f"the input stream ended before its last chunk (expected {checker.expected})"
                )
        except OmniError as exc:
            out.fail(exc)
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            pass

    async def _serve(
        self,
        context: grpc.aio.ServicerContext,
        request_id: str,
        chunks: AsyncIterator,
        pump: Callable[[asyncio.Event], Awaitable[None]] | None = None,
    ) -> AsyncIterator:
        """Yield the response chunks; abort the engine request however the stream ends."""
        # Initial metadata tells the caller the open was accepted (before any output exists), so a
        # gateway learns of a refused or unreachable stage before it streams anything to its client.
        await context.send_initial_metadata(())
        self.metrics.requests.inc()
        self.metrics.streams.inc()
        self.open_streams += 1
        output_done = asyncio.Event()
        pump_task = asyncio.ensure_future(pump(output_done)) if pump is not None else None
        ok = False
        try:
            async for chunk in chunks:
                self.metrics.chunks_out.inc()
                yield chunk
            ok = True
            output_done.set()
            if pump_task is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(pump_task), INPUT_DRAIN_SECONDS)
        except OmniError as exc:
            self.metrics.error(exc.kind)
            await abort_with(context, exc)
        finally:
            self.metrics.streams.dec()
            self.open_streams -= 1
            if pump_task is not None:
                pump_task.cancel()
                with contextlib.suppress(BaseException):
                    await pump_task
            if self.engine.abort(request_id) or not ok:
                self.metrics.aborts.inc()


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    max_message_bytes: int = 16 * 1024 * 1024
    max_streams: int = 256
    grace_seconds: float = 30.0
    tls_cert: str | None = None  # PEM paths; none given: plaintext
    tls_key: str | None = None
    tls_client_ca: str | None = None  # given: clients must present a certificate it signed (mTLS)


async def run_stage_server(
    servicer: StageServicer,
    add_to_server: Callable[[object, grpc.aio.Server], None],
    service_full_name: str,
    warmup: Callable[[], Awaitable[None]],
    options: ServeOptions,
) -> int:
    """Serve until SIGTERM: health goes SERVING only after the model is loaded and warmed up."""
    engine = servicer.engine
    engine.start()
    server = build_server(options.max_message_bytes, options.max_streams)
    add_to_server(servicer, server)
    health = add_health_and_reflection(server, [service_full_name])
    credentials = server_credentials(options.tls_cert, options.tls_key, options.tls_client_ca)
    port = add_port(server, f"{options.host}:{options.port}", credentials)
    await server.start()
    metrics_port = start_metrics_http(options.metrics_port, options.metrics_host, servicer.metrics.registry)
    stage = servicer.stage.value
    print(
        json.dumps(
            {
                "event": "listening",
                "stage": stage,
                "host": options.host,
                "port": port,
                "metrics_port": metrics_port,
                "tls": credentials is not None,
            }
        ),
        flush=True,
    )
    await warmup()
    await set_serving(health, True)
    print(json.dumps({"event": "serving", "stage": stage, "port": port}), flush=True)

    async def on_drain() -> None:
        # New streams get UNAVAILABLE while health answers NOT_SERVING; running ones finish.
        servicer.draining = True
        log.info("%s draining: %d streams open", stage, servicer.open_streams)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + options.grace_seconds
        while servicer.open_streams and loop.time() < deadline:
            await asyncio.sleep(0.05)

    await serve_until_signal(server, health, 1.0, on_drain)
    engine.stop()
    print(json.dumps({"event": "stopped", "stage": stage}), flush=True)
    sys.stdout.flush()
    return 0
