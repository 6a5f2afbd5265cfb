"""`omnistream serve gateway`: the REST/SSE and gRPC faces over one GatewayCore, in one event loop."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import ssl
from typing import Any

import uvicorn

from gateway.admission.limits import Limits
from gateway.api.app import build_app
from gateway.config import GatewayConfig
from gateway.serving.core import GatewayCore
from omnistream.service.gc_freeze import freeze_startup_heap
from omnistream.service.ports import listen_socket
from omnistream.service.security import ApiKeyInterceptor, add_port, server_credentials
from omnistream.service.server import GATEWAY_ORIGIN, add_health_and_reflection, build_server, set_serving
from omnistream.service.tracing import setup_tracing

log = logging.getLogger(__name__)

# RPCs the public gRPC port holds at once while admission's limits are derived: grpc fixes its bound
# when the server is built, before any stage has reported its room, and the room follows replicas
# that come and go; so the bound sits far above any deployment's room plus its queue, and admission
# refuses the excess itself (RESOURCE_EXHAUSTED with retry-after), as on REST.
DERIVED_GRPC_STREAMS = 4096


def grpc_streams(config: GatewayConfig) -> int:
    """The public gRPC port's bound: twice what may run and wait under an explicit cap (room for
    the quick refusals beside them), DERIVED_GRPC_STREAMS otherwise."""
    if config.max_concurrency is None:
        return DERIVED_GRPC_STREAMS
    capped = Limits.of(None, config.max_concurrency, config.max_queue)
    return 2 * (capped.concurrency + capped.queue)


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """The config `serve gateway`'s arguments say: defaults <- `--config` YAML <- flags given."""
    config = GatewayConfig.from_args(args)
    if args.sequential:
        config.async_chunk = False
    config.resolve_api_key()
    return config


async def serve(config: GatewayConfig, otlp_traces_endpoint: str | None = None) -> int:
    """Bind both ports before anything starts, so a taken port ends the process with one line
    (BindError, printed by the CLI) and nothing to clean up; then serve until SIGTERM/SIGINT.
    Tracing (when configured: the endpoint, or the OTEL_* environment) is installed before the
    first request and flushed after the last."""
    core = GatewayCore(config)
    tracing = setup_tracing("gateway", otlp_traces_endpoint)
    try:
        return await _serve(core, config)
    finally:
        if tracing is not None:
            tracing.shutdown()  # the drained requests' last spans, within a bound


async def _serve(core: GatewayCore, config: GatewayConfig) -> int:
    from gateway.api.grpc import SERVICE_NAME, add_gateway_api

    interceptors = None
    if config.api_key:
        interceptors = [ApiKeyInterceptor(config.api_key, [f"/{SERVICE_NAME}/"], GATEWAY_ORIGIN)]
    grpc_server = build_server(config.max_message_bytes, grpc_streams(config), interceptors=interceptors)
    name = add_gateway_api(grpc_server, core)
    health = add_health_and_reflection(grpc_server, [name])
    credentials = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
    grpc_port = add_port(grpc_server, f"{config.host}:{config.grpc_port}", credentials, "--grpc-port")
    http_socket = listen_socket(config.host, config.http_port, "--http-port")
    await core.start()
    await grpc_server.start()

    app = build_app(core)
    tls: dict[str, Any] = {}
    if config.tls_cert:
        tls = {"ssl_certfile": config.tls_cert, "ssl_keyfile": config.tls_key}
        if config.tls_client_ca:
            tls |= {"ssl_ca_certs": config.tls_client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.http_port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=30,
        **tls,
    )
    http = uvicorn.Server(uv_config)
    # uvicorn catches SIGTERM/SIGINT as it starts serving; the loop's handlers added below replace
    # its own, so we own SIGTERM: drain both faces together.
    http_task = asyncio.create_task(http.serve(sockets=[http_socket]))
    while not http.started:
        if http_task.done():
            await http_task
            return 1
        await asyncio.sleep(0.01)
    http_port = http.servers[0].sockets[0].getsockname()[1]
    freeze_startup_heap()  # start-up's objects: never walked by the cycle collector again
    await set_serving(health, True)
    print(
        json.dumps(
            {
                "event": "listening",
                "stage": "gateway",
                "host": config.host,
                "port": grpc_port,
                "grpc_port": grpc_port,
                "http_port": http_port,
                "metrics_port": http_port,
                "tls": credentials is not None,
                "api_key": bool(config.api_key),
            }
        ),
        flush=True,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("gateway draining")
    await health.enter_graceful_shutdown()
    http.should_exit = True
    await asyncio.gather(http_task, grpc_server.stop(30), return_exceptions=True)
    await core.stop()
    print(json.dumps({"event": "stopped", "stage": "gateway"}), flush=True)
    return 0


def main(args: argparse.Namespace) -> int:
    import uvloop

    return uvloop.run(serve(config_from_args(args), getattr(args, "otlp_traces_endpoint", None)))
