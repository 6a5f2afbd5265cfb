"""`omnistream serve gateway`: the REST/SSE and gRPC faces over one GatewayCore, in one event loop."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal

import uvicorn

from gateway.config import GatewayConfig
from gateway.core import GatewayCore
from gateway.rest import build_app
from omnistream.server import add_health_and_reflection, build_server, set_serving

log = logging.getLogger(__name__)


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    config = GatewayConfig.from_yaml(args.config) if args.config else GatewayConfig()
    for name in (
        "thinker",
        "talker",
        "code2wav",
        "model_dir",
        "model_name",
        "host",
        "http_port",
        "grpc_port",
        "max_concurrency",
        "max_queue",
        "queue_timeout",
        "request_timeout",
    ):
        value = getattr(args, name, None)
        if value is not None:
            setattr(config, name, value)
    if args.sequential:
        config.async_chunk = False
    return config


async def serve(config: GatewayConfig) -> int:
    from gateway.grpc_api import add_gateway_api

    core = GatewayCore(config)
    await core.start()
    grpc_server = build_server(config.max_message_bytes, config.max_concurrency * 2)
    name = add_gateway_api(grpc_server, core)
    health = add_health_and_reflection(grpc_server, [name])
    grpc_port = grpc_server.add_insecure_port(f"{config.host}:{config.grpc_port}")
    await grpc_server.start()

    app = build_app(core)
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.http_port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=30,
    )
    http = uvicorn.Server(uv_config)
    http.install_signal_handlers = lambda: None  # we own SIGTERM: drain both faces together
    http_task = asyncio.create_task(http.serve())
    while not http.started:
        if http_task.done():
            await http_task
            return 1
        await asyncio.sleep(0.01)
    http_port = http.servers[0].sockets[0].getsockname()[1]
    await set_serving(health, True)
    print(
        json.dumps(
            {
                "event": "listening",
                "stage": "gateway",
                "port": grpc_port,
                "grpc_port": grpc_port,
                "http_port": http_port,
                "metrics_port": http_port,
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

    return uvloop.run(serve(config_from_args(args)))
