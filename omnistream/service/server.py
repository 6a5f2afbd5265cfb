"""The gRPC plumbing every stage service shares: limits, keepalive, health, reflection, shutdown.

Kept in one place so the three stages cannot disagree about message limits or keepalive timing:
a client with a shorter keepalive than its server permits gets its connection closed with
GOAWAY(too_many_pings), and a sender with a larger message limit than its receiver gets
RESOURCE_EXHAUSTED, both far from their cause.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import NoReturn

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]  # no stubs
from grpc_reflection.v1alpha import reflection  # type: ignore[import-untyped]  # no stubs

from omnistream.request.errors import OmniError, status_of
from omnistream.service.ports import bind_error

log = logging.getLogger(__name__)

KEEPALIVE_TIME_MS = 20_000
KEEPALIVE_TIMEOUT_MS = 10_000
# "TIME_MS,TIMEOUT_MS" in the environment replaces both in every process of a deployment at once
# (they must agree, see above): the link-fault tests find a dead peer in seconds instead of 30.
KEEPALIVE_ENV = "OMNISTREAM_GRPC_KEEPALIVE_MS"
MAX_RECONNECT_BACKOFF_MS = 10_000
# Health checks and reflection are RPCs too: without headroom a saturated stage would fail its
# health probes with RESOURCE_EXHAUSTED and be restarted exactly when it is busiest.
CONTROL_RPC_HEADROOM = 8
ERROR_KIND_METADATA_KEY = "omni-error-kind"
# The request field an INVALID_ARGUMENT names (`OmniError.field`), when it names one: the gateway
# reports it as the client's `param` (a grammar that does not compile: "tools", "response_format").
ERROR_FIELD_METADATA_KEY = "omni-error-field"
# Set on every status our own code sends (`abort_with`): a status without it was made by gRPC itself
# (a broken transport reads as INTERNAL "Internal error from Core", grpc/grpc#36066), so the gateway
# trusts a stage's INTERNAL only when the stage marked it (gateway/serving/stage_calls.py, `stage_error`).
STATUS_ORIGIN_METADATA_KEY = "omni-status-origin"
STAGE_ORIGIN = "stage"
GATEWAY_ORIGIN = "gateway"
# The initial metadata a stage sends once it accepted a stream's open message. A stage that refuses
# sends none: gRPC then answers the caller's wait for initial metadata with an empty set, which
# alone does not tell a refusal from an acceptance (its status may come a moment later).
OPEN_METADATA_KEY = "omni-open"
OPEN_ACCEPTED = "accepted"
OPEN_ACCEPTED_METADATA = ((OPEN_METADATA_KEY, OPEN_ACCEPTED),)

ChannelOptions = list[tuple[str, int | str]]


def _message_limits(max_message_bytes: int) -> ChannelOptions:
    if max_message_bytes <= 0:
        # -1 means "unlimited" to gRPC; one huge tensor must not be able to exhaust memory.
        raise ValueError(f"max_message_bytes must be positive, got {max_message_bytes}")
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def keepalive_ms() -> tuple[int, int]:
    """(ping interval, ping timeout) in ms: the defaults, or `KEEPALIVE_ENV` when it is set."""
    value = os.environ.get(KEEPALIVE_ENV, "").strip()
    if not value:
        return KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS
    try:
        time_ms, timeout_ms = (int(part) for part in value.split(","))
    except ValueError:
        raise ValueError(f"{KEEPALIVE_ENV} must be TIME_MS,TIMEOUT_MS, got {value!r}") from None
    if time_ms < 100 or timeout_ms < 100:
        raise ValueError(f"{KEEPALIVE_ENV}: both values must be at least 100 ms, got {value!r}")
    return time_ms, timeout_ms


def _keepalive() -> ChannelOptions:
    time_ms, timeout_ms = keepalive_ms()
    return [
        ("grpc.keepalive_time_ms", time_ms),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def server_options(max_message_bytes: int) -> ChannelOptions:
    return [
        *_message_limits(max_message_bytes),
        *_keepalive(),
        # Clients may ping this often; half their interval leaves room for timer jitter.
        ("grpc.http2.min_recv_ping_interval_without_data_ms", keepalive_ms()[0] // 2),
        ("grpc.http2.max_ping_strikes", 2),
        # Linux SO_REUSEPORT would let a second replica bind the same port and silently share traffic.
        ("grpc.so_reuseport", 0),
    ]


def client_channel_options(max_message_bytes: int) -> ChannelOptions:
    """Options for channels to a stage; pair with the same `max_message_bytes` as the server."""
    return [
        *_message_limits(max_message_bytes),
        *_keepalive(),
        # Idle stage-to-stage connections must stay probed, or a dead peer is found only on next use.
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.enable_retries", 0),  # a retried stream would replay chunks; callers decide instead
        # A replica cut off for a while is retried at least this often (gRPC's default backs off to 2
        # minutes), so it is back in rotation soon after its network returns.
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ]


def build_server(
    max_message_bytes: int,
    max_concurrent_streams: int,
    *,
    interceptors: Sequence[grpc.aio.ServerInterceptor] | None = None,
) -> grpc.aio.Server:
    """A grpc.aio server with explicit limits; add servicers and ports, then `await server.start()`.

    `max_concurrent_streams` bounds request streams; CONTROL_RPC_HEADROOM more RPCs are admitted so
    health checks keep answering while the stage is full. RPCs beyond that get RESOURCE_EXHAUSTED.
    """
    if max_concurrent_streams <= 0:
        raise ValueError(f"max_concurrent_streams must be positive, got {max_concurrent_streams}")
    return grpc.aio.server(
        interceptors=interceptors,
        options=server_options(max_message_bytes),
        maximum_concurrent_rpcs=max_concurrent_streams + CONTROL_RPC_HEADROOM,
    )


class StageHealth(health.aio.HealthServicer):  # type: ignore[misc]  # grpc_health is untyped (Any)
    """Health servicer that knows its services and starts NOT_SERVING.

    Starting NOT_SERVING matters: the port is open before the model is loaded, and a probe that saw
    SERVING then would route traffic to a stage that cannot answer yet.
    """

    def __init__(self, service_names: Iterable[str]) -> None:
        super().__init__()
        self.service_names: tuple[str, ...] = ("", *dict.fromkeys(n for n in service_names if n))
        for name in self.service_names:
            # No watcher can exist yet, so the status map can be seeded without the async setter.
            self._server_status[name] = health_pb2.HealthCheckResponse.NOT_SERVING


def add_health_and_reflection(server: grpc.aio.Server, service_full_names: Iterable[str]) -> StageHealth:
    """Register grpc.health.v1 (all NOT_SERVING) and reflection for the given services."""
    names = list(service_full_names)
    servicer = StageHealth(names)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
        server,
    )
    return servicer


async def set_serving(health_servicer: StageHealth, serving: bool) -> None:
    """Flip the overall status ("") and every registered service together."""
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in health_servicer.service_names:
        await health_servicer.set(name, status)


async def serve_until_signal(
    server: grpc.aio.Server,
    health_servicer: StageHealth,
    grace_s: float,
    on_drain: Callable[[], Awaitable[None] | None] | None = None,
    *,
    stop: asyncio.Event | None = None,
) -> signal.Signals | None:
    """Run a started server until SIGTERM/SIGINT (or `stop` is set), then drain and stop it.

    Order matters for zero-downtime rollouts: report NOT_SERVING first so load balancers stop
    sending new work, let `on_drain` finish or hand off in-flight work, and only then stop the
    server, which cancels whatever is still running after `grace_s`. Returns the signal received,
    or None when stopped through `stop` or because the server terminated on its own.
    """
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        if received:
            log.warning("received %s again while draining; still waiting up to %.1fs", sig.name, grace_s)
            return
        log.info("received %s: draining", sig.name)
        received.append(sig)
        stop.set()

    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            log.warning("cannot install a %s handler here (not the main thread?)", sig.name)
    try:
        stopped = asyncio.ensure_future(stop.wait())
        # Never cancel this one: grpc.aio shares the shutdown future with wait_for_termination, and
        # cancelling it makes the later server.stop() raise CancelledError. It ends with the server.
        terminated = asyncio.ensure_future(server.wait_for_termination())
        try:
            await asyncio.wait({stopped, terminated}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        await health_servicer.enter_graceful_shutdown()
        if on_drain is not None:
            try:
                result = on_drain()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("on_drain failed; stopping the server anyway")
        await server.stop(grace_s)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
    return received[0] if received else None


async def abort_with(
    context: grpc.aio.ServicerContext, error: BaseException, origin: str = STAGE_ORIGIN
) -> NoReturn:
    """Fail the RPC with the status `errors.STATUS_TABLE` assigns to `error`.

    The error kind travels in trailing metadata so the gateway can rebuild the exact domain error
    (e.g. SequenceError vs InvalidRequest, which share INVALID_ARGUMENT), and with it the `origin`
    marker that tells a status this service sent from one gRPC made up when the link broke.
    Unexpected exceptions are logged here and reported without their message, which may contain
    internals.
    """
    if isinstance(error, asyncio.CancelledError | grpc.aio.AbortError):
        raise error  # already cancelled or aborted: re-aborting would mask the real outcome
    field = None
    if isinstance(error, OmniError):
        kind, message, field = error.kind, error.message, error.field
    else:
        log.error("internal error in RPC", exc_info=error)
        kind, message = "internal", f"internal error ({type(error).__name__})"
    metadata = [(ERROR_KIND_METADATA_KEY, kind), (STATUS_ORIGIN_METADATA_KEY, origin)]
    if field:
        metadata.append((ERROR_FIELD_METADATA_KEY, field))
    await context.abort(status_of(error).grpc_code, message, trailing_metadata=tuple(metadata))
    raise AssertionError("context.abort returned")  # pragma: no cover  (abort always raises)


def start_metrics_http(
    port: int, host: str = "127.0.0.1", registry: prometheus_client.CollectorRegistry | None = None
) -> int:
    """Serve Prometheus metrics from a daemon thread; returns the bound port (useful with port 0).

    A port that cannot be bound raises BindError (a one-line message naming --metrics-port).
    """
    registry = registry if registry is not None else prometheus_client.REGISTRY
    try:
        server, _thread = prometheus_client.start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise bind_error(f"{host}:{port}", "--metrics-port") from exc
    return int(server.server_port)
