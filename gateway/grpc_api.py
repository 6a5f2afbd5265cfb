"""The gateway's gRPC face: `omni.v1.Gateway/Generate` and `/Info` (protos/omni/v1/gateway.proto)
over GatewayCore.

Refusals (validation, admission, no replica, a stage refusing the request) happen inside
`GatewayCore.open()`, before the first event, and become plain gRPC statuses; RESOURCE_EXHAUSTED
also carries trailing metadata "retry-after". Once the stream started, a failure is reported as one
`error` event followed by the matching status. Cancelling the RPC closes the session, which cancels
the request in every stage and releases its admission permit.

The handler writes with `context.write()` instead of being an async generator on purpose: grpc.aio
cancels the handler task when the client goes away, so the cancellation surfaces inside this code
(at a write or while waiting for the next event) and the `finally` closes the session at once. An
async-generator handler suspended at `yield` would only be closed whenever it is garbage collected.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING

import grpc
import numpy as np

from gateway.admission import Rejected
from omnistream.chunk_key import ChunkKey, Stage
from omnistream.errors import InvalidRequest, OmniError, Unavailable
from omnistream.protogen import ensure_generated
from omnistream.request import AudioEvent, DoneEvent, GenerationRequest, TextEvent

ensure_generated()

from omnistream.convert import sampling_from_proto  # noqa: E402  (generated just above)
from omnistream.proto.omni.v1 import gateway_pb2, gateway_pb2_grpc  # noqa: E402
from omnistream.server import ERROR_KIND_METADATA_KEY, abort_with  # noqa: E402
from omnistream.tensors import to_proto  # noqa: E402
from omnistream.wire import Method, add_service, checked  # noqa: E402

if TYPE_CHECKING:
    from gateway.config import GatewayConfig
    from gateway.core import GatewayCore

log = logging.getLogger(__name__)

SERVICE_NAME: str = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name
RETRY_AFTER_METADATA_KEY = "retry-after"
ROLES = ("system", "user", "assistant")
DEFAULT_SPEAKER: str = GenerationRequest.speaker  # the dataclass default

Event = gateway_pb2.GenerateEvent


def default_speaker(voices: tuple[str, ...] | None) -> str:
    """The pipeline's default voice when the deployment's talker has it, else its first voice."""
    if not voices or DEFAULT_SPEAKER in (v.lower() for v in voices):
        return DEFAULT_SPEAKER
    return voices[0]


def to_generation_request(
    request: gateway_pb2.GenerateRequest, config: GatewayConfig, voices: tuple[str, ...] | None = None
) -> GenerationRequest:
    """Map the wire request to the pipeline's; proto3 zeros and unset optionals become config defaults.

    Only what the wire format alone can get wrong is checked here (prompt shape, roles, sampling);
    limits that depend on the deployment are checked by `GatewayCore.open()`.
    """
    if bool(request.messages) == bool(request.prompt_ids):
        raise InvalidRequest("give exactly one of messages or prompt_ids", field="messages")
    for i, message in enumerate(request.messages):
        if message.role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role must be system, user or assistant", field="messages")
    async_chunk = request.async_chunk if request.HasField("async_chunk") else bool(config.async_chunk)
    initial = request.initial_codec_chunk_frames if request.HasField("initial_codec_chunk_frames") else None
    return GenerationRequest(
        messages=[{"role": m.role, "content": m.content} for m in request.messages] or None,
        prompt_ids=list(request.prompt_ids) or None,
        max_tokens=request.max_tokens or config.default_max_tokens,
        ignore_eos=request.ignore_eos,
        sampling=sampling_from_proto(request.sampling),
        return_audio=not request.text_only,
        speaker=request.speaker or default_speaker(voices),
        max_audio_frames=request.max_audio_frames or config.max_audio_frames,
        talker_sampling=sampling_from_proto(request.talker_sampling, "talker_"),
        initial_codec_chunk_frames=initial,
        codec_chunk_frames=config.codec_chunk_frames,
        codec_left_context_frames=config.codec_left_context_frames,
        mode="async" if async_chunk else "sequential",
    )


def request_timeout(request: gateway_pb2.GenerateRequest, time_remaining: float | None) -> float | None:
    """`timeout_seconds`, capped by the RPC deadline; None leaves the gateway's own timeout."""
    timeout = None
    if request.HasField("timeout_seconds"):
        timeout = request.timeout_seconds
        if not (math.isfinite(timeout) and timeout > 0):
            raise InvalidRequest(
                "timeout_seconds must be a positive number of seconds", field="timeout_seconds"
            )
    if time_remaining is not None:
        # Never 0: the core reads a falsy timeout as "use the default".
        remaining = max(time_remaining, 1e-3)
        timeout = remaining if timeout is None else min(timeout, remaining)
    return timeout


def to_events(event: TextEvent | AudioEvent | DoneEvent) -> list[gateway_pb2.GenerateEvent]:
    """The wire events for one core event, without keys; empty text and empty audio send nothing."""
    if isinstance(event, TextEvent):
        if not (event.delta or event.token_ids):
            return []
        return [Event(text=Event.TextDelta(text=event.delta, token_ids=event.token_ids))]
    if isinstance(event, AudioEvent):
        pcm = np.asarray(event.audio, dtype=np.float32).reshape(-1)
        if not pcm.size:
            return []
        return [
            Event(
                audio=Event.AudioChunk(
                    pcm=to_proto(pcm), sample_rate=event.sample_rate, first_sample=event.first_sample
                )
            )
        ]
    if isinstance(event, DoneEvent):
        usage = Event.Summary(
            prompt_tokens=len(event.prompt_ids),
            completion_tokens=len(event.output_ids),
            audio_frames=event.frames,
            audio_samples=event.audio_samples,
            e2e_seconds=event.e2e,
        )
        if event.ttft is not None:
            usage.ttft_seconds = event.ttft
        if event.ttfp is not None:
            usage.ttfp_seconds = event.ttfp
        return [Event(usage=usage), Event(end=Event.End(finish_reason=event.finish_reason))]
    raise TypeError(f"unexpected event {type(event).__name__}")


def _name_field(error: BaseException) -> BaseException:
    """Make sure an error about a field names it in the message the client sees."""
    if isinstance(error, OmniError) and error.field and error.field not in error.message:
        error.message = f"{error.field}: {error.message}"
    return error


def error_event(error: BaseException) -> gateway_pb2.GenerateEvent:
    """The `error` event matching what `abort_with` will report (internals are not leaked)."""
    if isinstance(error, OmniError):
        body = Event.Error(kind=error.kind, message=error.message, field=error.field or "")
    else:
        body = Event.Error(kind="internal", message=f"internal error ({type(error).__name__})")
    return Event(error=body)


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, core: GatewayCore) -> None:
        self.core = core

    async def Generate(self, request: gateway_pb2.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        try:
            request = checked(request)  # bytes that did not parse: INVALID_ARGUMENT, not UNKNOWN
            generation = to_generation_request(request, self.core.config, self.core.deployment.voices)
            timeout = request_timeout(request, context.time_remaining())
            session = await self.core.open(generation, request_id=request.request_id or None, timeout=timeout)
        except Rejected as exc:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                exc.message,
                trailing_metadata=(
                    (ERROR_KIND_METADATA_KEY, exc.kind),
                    (RETRY_AFTER_METADATA_KEY, str(exc.retry_after)),
                ),
            )
            raise AssertionError("context.abort returned") from exc  # pragma: no cover
        except Exception as exc:
            await abort_with(context, _name_field(exc))

        index = 0
        try:
            async with contextlib.aclosing(session.events()) as events:
                async for event in events:
                    for message in to_events(event):
                        message.key.CopyFrom(ChunkKey(session.request_id, Stage.GATEWAY, index).to_proto())
                        await context.write(message)
                        index += 1
        except Exception as exc:
            _name_field(exc)
            message = error_event(exc)
            message.key.CopyFrom(ChunkKey(session.request_id, Stage.GATEWAY, index).to_proto())
            with contextlib.suppress(Exception):
                await context.write(message)
            await abort_with(context, exc)
        finally:
            await session.aclose()

    async def Info(
        self, request: gateway_pb2.GatewayInfoRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.GatewayInfo:
        try:
            checked(request)
            if not self.core.deployment.complete:
                raise Unavailable("the gateway has not accepted a replica of every stage yet")
        except OmniError as exc:
            await abort_with(context, exc)
        return self.core.deployment.to_proto()


def add_gateway_api(server: grpc.aio.Server, core: GatewayCore) -> str:
    """Serve `omni.v1.Gateway` on `server` from `core`; returns the service's full name (for health
    and reflection, see `omnistream.server.add_health_and_reflection`)."""
    servicer = GatewayServicer(core)
    add_service(
        server,
        SERVICE_NAME,
        [
            Method("Generate", servicer.Generate, gateway_pb2.GenerateRequest, Event, "unary_stream"),
            Method(
                "Info", servicer.Info, gateway_pb2.GatewayInfoRequest, gateway_pb2.GatewayInfo, "unary_unary"
            ),
        ],
    )
    return SERVICE_NAME
