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
from typing import TYPE_CHECKING, Any, TypedDict

import grpc
import numpy as np

from gateway.admission.permits import Rejected
from gateway.media.parts import from_bytes
from gateway.serving.tracing import grpc_entry
from omnistream.request.defaults import RequestInput, ServingDefaults, resolve
from omnistream.request.errors import InvalidRequest, OmniError, Unavailable
from omnistream.request.generation import AudioEvent, DoneEvent, GenerationRequest, TextEvent
from omnistream.wire.chunk_key import ChunkKey, Stage
from omnistream.wire.protogen import ensure_generated

ensure_generated()

from omnistream.proto.omni.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc  # noqa: E402
from omnistream.service.server import (  # noqa: E402
    ERROR_KIND_METADATA_KEY,
    GATEWAY_ORIGIN,
    STATUS_ORIGIN_METADATA_KEY,
    abort_with,
)
from omnistream.wire.convert import schedule_from_proto, wire_float  # noqa: E402  (generated just above)
from omnistream.wire.grpc_codec import Method, add_service, checked  # noqa: E402
from omnistream.wire.tensors import to_proto  # noqa: E402

if TYPE_CHECKING:
    from gateway.config import GatewayConfig
    from gateway.serving.core import GatewayCore

log = logging.getLogger(__name__)

SERVICE_NAME: str = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name
RETRY_AFTER_METADATA_KEY = "retry-after"

Event = gateway_pb2.GenerateEvent


class _SamplingGiven(TypedDict, total=False):
    """The knobs of a `Sampling` the client set: all of them, or none when it sent no message."""

    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int | None


def _sampling_given(msg: common_pb2.Sampling) -> _SamplingGiven:
    """A `Sampling` the client set, as given: its zeros keep their documented meaning (temperature 0
    is greedy, top_p/top_k/repetition_penalty 0 are off), since proto3 cannot tell them from unset."""
    # float32 values read back as the decimals sent; bounds are checked by `resolve`, in its order.
    return {
        "temperature": wire_float(msg.temperature),
        "top_p": wire_float(msg.top_p) if msg.top_p else 1.0,
        "top_k": int(msg.top_k),
        "repetition_penalty": wire_float(msg.repetition_penalty) if msg.repetition_penalty else 1.0,
        "seed": int(msg.seed) if msg.HasField("seed") else None,
    }


def message_content(message: common_pb2.Message, index: int) -> str | list[dict[str, Any]]:
    """A turn's content for `RequestInput`: `content`, or its `parts` (text and encoded media; a
    turn of text parts only is one string, as REST makes it). Decoded forms are the stage API's."""
    at = f"messages.{index}"
    if not message.parts:
        return message.content
    if message.content:
        raise InvalidRequest("give a turn's content or its parts, not both", field=f"{at}.content")
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(message.parts):
        which = part.WhichOneof("kind")
        if which == "text":
            parts.append({"type": "text", "text": part.text})
        elif which == "media":
            media = from_bytes(
                part.media.kind, part.media.mime_type, part.media.data, f"{at}.parts.{i}.media"
            )
            parts.append({"type": media.kind, media.kind: media})
        else:
            raise InvalidRequest(
                "a part must be text or media (encoded bytes and their MIME type)"
                + (f"; {which} is the stages' decoded form" if which else ""),
                field=f"{at}.parts.{i}",
            )
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def to_request_input(request: gateway_pb2.GenerateRequest) -> RequestInput:
    """The wire request as given: proto3 zeros and unset fields become None ("not given"), and an
    unset `sampling`/`talker_sampling` message leaves every knob of it to the defaults."""
    thinker: _SamplingGiven = _sampling_given(request.sampling) if request.HasField("sampling") else {}
    talker: _SamplingGiven = (
        _sampling_given(request.talker_sampling) if request.HasField("talker_sampling") else {}
    )
    return RequestInput(
        messages=[{"role": m.role, "content": message_content(m, i)} for i, m in enumerate(request.messages)]
        or None,
        prompt_ids=list(request.prompt_ids) or None,
        max_tokens=request.max_tokens or None,
        ignore_eos=request.ignore_eos,
        temperature=thinker.get("temperature"),
        top_p=thinker.get("top_p"),
        top_k=thinker.get("top_k"),
        repetition_penalty=thinker.get("repetition_penalty"),
        seed=thinker.get("seed"),
        return_audio=not request.text_only,
        voice=request.speaker or None,
        max_audio_frames=request.max_audio_frames or None,
        talker_temperature=talker.get("temperature"),
        talker_top_p=talker.get("top_p"),
        talker_top_k=talker.get("top_k"),
        talker_repetition_penalty=talker.get("repetition_penalty"),
        talker_seed=talker.get("seed"),
        initial_codec_chunk_frames=(
            request.initial_codec_chunk_frames if request.HasField("initial_codec_chunk_frames") else None
        ),
        codec_chunk_schedule=schedule_from_proto(
            request.codec_chunk_schedule, None, field="codec_chunk_schedule"
        ),
        async_chunk=request.async_chunk if request.HasField("async_chunk") else None,
        use_audio_in_video=(request.use_audio_in_video if request.HasField("use_audio_in_video") else None),
    )


def to_generation_request(
    request: gateway_pb2.GenerateRequest,
    config: GatewayConfig,
    voices: tuple[str, ...] | None = None,
    default_voice: str | None = None,
) -> GenerationRequest:
    """The request the wire message asks for, defaults from the one table (`omnistream.request.defaults`).

    Only what the request alone can get wrong is checked here (prompt shape, roles, sampling);
    limits that depend on the deployment are checked by `GatewayCore.open()`.
    """
    return resolve(to_request_input(request), ServingDefaults.of(config, voices, default_voice))


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
            cached_tokens=event.cached_tokens,
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
            deployment = self.core.deployment
            generation = to_generation_request(
                request, self.core.config, deployment.voices, deployment.default_voice
            )
            timeout = request_timeout(request, context.time_remaining())
            trace = grpc_entry(SERVICE_NAME, "Generate", context.invocation_metadata())
            rid = request.request_id or None
            session = await self.core.open(generation, request_id=rid, timeout=timeout, trace=trace)
        except Rejected as exc:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                exc.message,
                trailing_metadata=(
                    (ERROR_KIND_METADATA_KEY, exc.kind),
                    (STATUS_ORIGIN_METADATA_KEY, GATEWAY_ORIGIN),
                    (RETRY_AFTER_METADATA_KEY, str(exc.retry_after)),
                ),
            )
            raise AssertionError("context.abort returned") from exc  # pragma: no cover
        except Exception as exc:
            await abort_with(context, _name_field(exc), GATEWAY_ORIGIN)

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
            # Freed before the status goes out: a client that retries on it finds the permit back.
            await session.aclose()
            await abort_with(context, exc, GATEWAY_ORIGIN)
        finally:
            await session.aclose()

    async def Info(
        self, request: gateway_pb2.GatewayInfoRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.GatewayInfo:
        try:
            checked(request)
            if not self.core.deployment.known:  # thinkers alone: the model, output text only
                raise Unavailable("the gateway has not accepted a thinker replica yet")
        except OmniError as exc:
            await abort_with(context, exc, GATEWAY_ORIGIN)
        return self.core.deployment.to_proto()


def add_gateway_api(server: grpc.aio.Server, core: GatewayCore) -> str:
    """Serve `omni.v1.Gateway` on `server` from `core`; returns the service's full name (for health
    and reflection, see `omnistream.service.server.add_health_and_reflection`)."""
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
