"""What every stage servicer shares: the stream lifecycle and its bookkeeping (the process around it
is `bootstrap.run_stage_server`).

Servicers stay thin (proto <-> domain, validation, cancellation); engines know nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from omnistream.engine.api import StageEngine
from omnistream.engine.output_stream import OutputStream
from omnistream.proto.omni.v1 import common_pb2, stage_pb2
from omnistream.request.chunk_plan import ChunkPlan
from omnistream.request.errors import InternalError, InvalidRequest, OmniError, Unavailable
from omnistream.service.metrics import StageMetrics
from omnistream.service.server import (
    OPEN_ACCEPTED_METADATA,
    abort_with,
)
from omnistream.service.speed import SpeedMeter
from omnistream.service.stage_tracing import StreamSpan
from omnistream.wire.chunk_key import ChunkKey, SequenceChecker, Stage, validate_request_id
from omnistream.wire.convert import checked_cache_scope, plan_from_fields
from omnistream.wire.grpc_codec import Method, add_service, checked, parsed
from omnistream.wire.limits import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

INPUT_DRAIN_SECONDS = 10.0  # how long a finished stream waits for the client to half-close
# How long an input that ended before its last chunk waits to be told apart from a cancelled call.
INPUT_END_GRACE_SECONDS = 0.2
# Before a stream is failed, what the client is still sending is read (and dropped) until it
# half-closes, pauses this long, or this much time has passed (see `_drain_before_error`). The pause
# is long enough for a client starved by a loaded machine between two writes (at 50 ms, 1 of 40
# refused opens still read INTERNAL under make test's two workers and two CPU burners).
ERROR_DRAIN_IDLE_SECONDS = 0.2
ERROR_DRAIN_SECONDS = 0.5

# The chunk protocol of protos/omni/v1/stage.proto (see StageInfo.chunk_protocol_version there).
CHUNK_PROTOCOL_VERSION = 1
# What a stage calls its model unless told otherwise (`--served-model-name`).
DEFAULT_MODEL_ID = "qwen3-omni"


def software_version() -> str:
    try:
        return importlib.metadata.version("omnistream")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


MODES = {
    common_pb2.MODE_UNSPECIFIED: "async",
    common_pb2.MODE_ASYNC_CHUNK: "async",
    common_pb2.MODE_SEQUENTIAL: "sequential",
}


@dataclass
class Admitted:
    """A request the engine accepted at the open message, and how its stream runs."""

    request_id: str
    output: OutputStream[Any]
    chunks: AsyncIterator[Any]  # the response messages, from the engine's output
    checker: SequenceChecker  # keys of the input chunks after the open
    # Handles one input chunk, returns True on the last one. None: the stage takes no input after
    # the open (the thinker), so any further message is a protocol violation.
    handle: Callable[[Any], bool] | None = None  # an input message (the stage's own type)


class StageServicer:
    """Base of the three servicers: the one request lifecycle, draining, metrics, the input pump.

    `Stream` is a coroutine that writes with `context.write()` rather than an async generator:
    grpc.aio cancels the handler task when the call ends early (cancel, deadline, disconnect), and
    that cancellation then lands inside `Stream`, whose single `finally` releases the engine request.
    A generator suspended at `yield` would only be closed whenever it is garbage collected, and any
    await between adding the request and entering the `try` was a window in which a cancel leaked it.
    """

    stage: Stage
    input_stage: Stage  # the stage whose output this service consumes (keys of incoming chunks)
    request_type: Any  # the generated message class (its DESCRIPTOR names the service)
    response_type: Any
    drain_input = True  # after the output ends, wait (a while) for the client to half-close

    def __init__(
        self,
        engine: StageEngine,
        metrics: StageMetrics,
        model_id: str = DEFAULT_MODEL_ID,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.model_id = model_id
        self.max_message_bytes = max_message_bytes
        self._info: stage_pb2.StageInfo | None = None
        self.draining = False
        self.open_streams = 0
        self._stream_outputs: dict[str, OutputStream[Any]] = {}  # request id -> output, per open stream
        metrics.track_streams(self)
        self.speed = SpeedMeter()  # reported in every Info (StageInfo.load): the gateway admits by it
        engine.add_step_listener(self.speed)

    async def _open(self, first: Any) -> Admitted:
        """Validate the open message and add the request to the engine (subclasses)."""
        raise NotImplementedError

    def _describe(self, info: stage_pb2.StageInfo) -> None:
        """Fill the facts and limits this stage owns (subclasses; see StageInfo in stage.proto)."""
        raise NotImplementedError

    def info(self) -> stage_pb2.StageInfo:
        """This replica's identity and limits; built once, since they never change while the process
        runs (the Info RPC adds the measured `load`: `info_now`)."""
        if self._info is None:
            info = stage_pb2.StageInfo(
                stage=common_pb2.Stage.Value(f"STAGE_{self.stage.name}"),
                model_id=self.model_id,
                chunk_protocol_version=CHUNK_PROTOCOL_VERSION,
                software_version=software_version(),
            )
            info.limits.max_batch = getattr(self.engine, "max_batch", 0)
            info.limits.max_requests = self.engine.max_requests
            info.limits.max_message_bytes = self.max_message_bytes
            self._describe(info)
            self._info = info
        return self._info

    def info_now(self) -> stage_pb2.StageInfo:
        """`info()` plus the load measured now (a copy: the cached identity is never touched)."""
        info = stage_pb2.StageInfo()
        info.CopyFrom(self.info())
        speed = self.speed.speed()
        running, waiting = self.engine.counts()
        info.load.CopyFrom(
            stage_pb2.StageLoad(
                capacity_per_second=speed.capacity_per_second,
                output_per_second=speed.output_per_second,
                mean_batch=speed.mean_batch,
                busy_fraction=speed.busy_fraction,
                measured_steps=speed.measured_steps,
                window_seconds=speed.window_seconds,
                running=running,
                waiting=waiting,
            )
        )
        if speed.fit is not None:
            info.load.step_base_seconds = speed.fit.base_seconds
            info.load.step_unit_seconds = speed.fit.unit_seconds
            info.load.units_per_row = speed.fit.units_per_row
            info.load.model_points = speed.fit.points
            info.load.model_slowdown = speed.fit.slowdown
        return info

    async def Info(self, request: Any, context: grpc.aio.ServicerContext) -> stage_pb2.StageInfo:
        try:
            checked(request)
        except OmniError as exc:
            await abort_with(context, exc)
        return self.info_now()

    async def ReleaseCache(
        self, request: stage_pb2.ReleaseCacheRequest, context: grpc.aio.ServicerContext
    ) -> stage_pb2.ReleaseCacheReply:
        """A cache scope ended: the engine drops its cached prefixes before its next step (an
        engine without a prefix cache, or a scope it never saw, has nothing to drop)."""
        try:
            checked(request)
            scope = checked_cache_scope(request.cache_scope)
            if not scope:
                raise InvalidRequest(
                    "cache_scope is empty: the shared scope is never released", field="cache_scope"
                )
        except OmniError as exc:
            await abort_with(context, exc)
        release = getattr(self.engine, "release_cache_scope", None)
        if release is not None:
            release(scope)
        self.release_scope(scope)
        return stage_pb2.ReleaseCacheReply()

    def release_scope(self, scope: bytes) -> None:
        """What the servicer itself keeps for a cache scope, dropped when it ends (the thinker's
        kept audio); nothing here."""

    def orphaned_requests(self) -> int:
        """Engine requests without an open stream: always 0 unless the lifecycle leaks."""
        streams = self._stream_outputs.copy()  # read from the metrics thread: one atomic copy
        return sum(1 for rid in self.engine.request_ids() if rid not in streams)

    async def Stream(self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        requests = parsed(request_iterator)
        self.open_streams += 1
        self.metrics.streams.inc()
        span = StreamSpan(
            self.stage.value, self.request_type.DESCRIPTOR.file.package + "." + self.service_name, context
        )
        admitted: Admitted | None = None
        pump_task: asyncio.Task[None] | None = None
        ok = False
        try:
            if self.draining:
                raise Unavailable(f"{self.stage.value} is draining")
            admitted = await self._open(await self._first(requests, context))
            # Nothing awaits between the engine's add (inside _open) and this line.
            self._stream_outputs[admitted.request_id] = admitted.output
            self.metrics.requests.inc()
            span.admitted(admitted.request_id, self.engine.counts)
            # Initial metadata tells the caller the open was accepted (before any output exists), so
            # a gateway learns of a refused or unreachable stage before it streams to its client.
            await context.send_initial_metadata(OPEN_ACCEPTED_METADATA)
            output_done = asyncio.Event()
            pump_task = asyncio.ensure_future(self._pump(requests, admitted, output_done, context))
            async for chunk in admitted.chunks:
                self.metrics.chunks_out.inc()
                span.chunk(chunk)
                await context.write(chunk)
            ok = True
            output_done.set()
            if self.drain_input:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(pump_task), INPUT_DRAIN_SECONDS)
        except OmniError as exc:
            self.metrics.error(exc.kind)
            span.failed(exc)
            await self._drain_before_error(requests, pump_task)
            await abort_with(context, exc)
        except BaseException as exc:  # cancelled (the caller ended the call) or a bug: recorded, raised
            span.failed(exc)
            raise
        finally:
            self.metrics.streams.dec()
            self.open_streams -= 1
            if pump_task is not None:
                pump_task.cancel()
                with contextlib.suppress(BaseException):
                    await pump_task
            if admitted is not None:
                rid = admitted.request_id
                if self._stream_outputs.get(rid) is admitted.output:
                    del self._stream_outputs[rid]
                if self.engine.abort(rid, admitted.output) or not ok:
                    self.metrics.aborts.inc()
            span.end(context, admitted.checker.expected.index - 1 if admitted is not None else 0)

    async def _drain_before_error(
        self, requests: AsyncIterator[Any], pump_task: asyncio.Task[None] | None
    ) -> None:
        """Read what the client is still writing before the status ends the call.

        A grpc.aio client whose write fails because the server already ended the call reports
        INTERNAL "Internal error from Core" in place of the status the server sent (grpc/grpc
        #36066): a client that sends its open and a few inputs at once, and is refused at the open,
        would see INTERNAL instead of the INVALID_ARGUMENT naming its fault. Its messages in flight
        are read first, until it half-closes or pauses, within a bound (a client that keeps the
        stream open, as the gateway does, only delays its error by one pause). Only when the pump
        is not reading them itself."""
        if pump_task is not None and not pump_task.done():
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ERROR_DRAIN_SECONDS
        # StopAsyncIteration (half-closed), a malformed message, or the pause: the drain is over.
        with contextlib.suppress(Exception):
            while (left := deadline - loop.time()) > 0:
                await asyncio.wait_for(anext(requests), min(ERROR_DRAIN_IDLE_SECONDS, left))

    async def _first(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext | None = None
    ) -> Any:
        """The open message. A stream that ends before it is refused, unless the call was only
        cancelled (a gateway whose client left before it wrote the open): that is no error of
        this stage's (see `_pump` for the grace that tells the two apart)."""
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            if context is not None:
                await asyncio.sleep(INPUT_END_GRACE_SECONDS)
                if context.cancelled():
                    raise asyncio.CancelledError from None
            raise InvalidRequest("the stream ended before its open message") from None
        if first.WhichOneof("kind") != "open":
            raise InvalidRequest("the first message of a stream must be `open`", field="open")
        return first

    @contextlib.contextmanager
    def chunk_cpu(self, direction: str) -> Iterator[None]:
        """Thread CPU time of turning one chunk into engine input ("in") or into a message ("out")."""
        started = time.thread_time()
        try:
            yield
        finally:
            self.metrics.chunk_cpu.labels(stage=self.stage.value, direction=direction).observe(
                time.thread_time() - started
            )

    def _open_streaming(
        self, open_: Any, key: common_pb2.ChunkKey
    ) -> tuple[str, SequenceChecker, str, ChunkPlan]:
        """The fields talker and code2wav opens share: (request id, input checker, mode, chunk plan)."""
        rid = validate_request_id(open_.request_id)
        checker = self._checker(rid, key)
        mode = MODES.get(open_.mode)
        if mode is None:
            raise InvalidRequest("unknown mode", field="mode")
        plan = plan_from_fields(
            open_.initial_chunk_frames, open_.chunk_frames, open_.left_context_frames, open_.chunk_schedule
        )
        return rid, checker, mode, plan

    def _checker(self, request_id: str, key: common_pb2.ChunkKey) -> SequenceChecker:
        checker = SequenceChecker(request_id, self.input_stage)
        checker.expect(key)  # the open message is chunk 0
        return checker

    async def _pump(
        self,
        requests: AsyncIterator[Any],
        admitted: Admitted,
        output_done: asyncio.Event,
        context: grpc.aio.ServicerContext | None = None,
    ) -> None:
        """Read input chunks until the one marked last; any problem fails the request's output.

        Once this stage's output is complete (codec EOS before the thinker ended, say) the rest of
        the input is read and dropped: the RPC closes only after the client half-closes, so a
        client write never races the end of the call.

        A cancelled call (the client left) also ends the input iterator, often before the call
        reads as cancelled: so an input that ends early fails the request only once the call has
        stayed alive a moment longer (`INPUT_END_GRACE_SECONDS`); a cancellation meanwhile ends this
        pump with the stream, and a client leaving is never counted as this stage's error.
        """
        out, checker = admitted.output, admitted.checker
        try:
            finished = admitted.handle is None
            async for message in requests:
                if output_done.is_set():
                    continue
                if admitted.handle is None:
                    raise InvalidRequest(
                        f"the {self.stage.value} takes no message after its open", field="open"
                    )
                if finished:
                    raise InvalidRequest(
                        f"chunk {ChunkKey.from_proto(message.key)} arrived after the last one"
                    )
                checker.expect(message.key)
                if message.WhichOneof("kind") != "input":
                    raise InvalidRequest("only the first message may be `open`", field="open")
                self.metrics.chunks_in.inc()
                with self.chunk_cpu("in"):
                    finished = admitted.handle(message.input)
            if not finished and context is not None:
                await asyncio.sleep(INPUT_END_GRACE_SECONDS)
                if context.cancelled():
                    return
            if not finished:
                raise InvalidRequest(
                    f"the input stream ended before its last chunk (expected {checker.expected})"
                )
        except OmniError as exc:
            out.fail(exc)
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            pass
        except Exception as exc:  # a bug in input handling fails this request, never the stage
            log.exception("%s: input handling failed", self.stage.value)
            out.fail(InternalError(f"{self.stage.value} could not handle its input ({type(exc).__name__})"))

    def add_to_server(self, server: grpc.aio.Server) -> str:
        """Register `Stream`, `Info` (and `ReleaseCache` where the service has it) with tolerant
        parsing; returns the service's full name."""
        service = self.request_type.DESCRIPTOR.file.services_by_name[self.service_name]
        methods = [
            Method("Stream", self.Stream, self.request_type, self.response_type),
            Method("Info", self.Info, stage_pb2.InfoRequest, stage_pb2.StageInfo, "unary_unary"),
        ]
        if "ReleaseCache" in service.methods_by_name:
            release = (stage_pb2.ReleaseCacheRequest, stage_pb2.ReleaseCacheReply)
            methods.append(Method("ReleaseCache", self.ReleaseCache, *release, "unary_unary"))
        add_service(server, service.full_name, methods)
        return str(service.full_name)

    service_name: str  # e.g. "TalkerService" in omni.v1
