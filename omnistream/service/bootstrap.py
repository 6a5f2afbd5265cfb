"""A stage process's bootstrap: bind, warm up, report SERVING, drain on SIGTERM, exit on a lost device.

Apart from the servicer (`stage_service.StageServicer`, one stream's lifecycle) because this is the
process's lifecycle: the order of health states a deployment relies on, and the exit status an
orchestrator restarts on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from omnistream.service.gc_freeze import freeze_startup_heap
from omnistream.service.security import add_port, server_credentials
from omnistream.service.server import (
    add_health_and_reflection,
    build_server,
    serve_until_signal,
    set_serving,
    start_metrics_http,
)
from omnistream.service.stage_service import StageServicer

log = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    """Where and how a stage serves; every value from its `serve` settings (services/serve_args.py
    `StageSettings`, where the defaults are), so none is defaulted here."""

    host: str
    port: int
    metrics_port: int
    metrics_host: str
    max_message_bytes: int
    max_streams: int
    grace_seconds: float
    tls_cert: str | None  # PEM paths; none given: plaintext
    tls_key: str | None
    tls_client_ca: str | None  # given: clients must present a certificate it signed (mTLS)


# Exit status of a stage whose device was poisoned (a CUDA fault): non-zero, so it is restarted.
EXIT_DEVICE_POISONED = 3
POISONED_GRACE_S = 5.0


async def run_stage_server(
    servicer: StageServicer,
    warmup: Callable[[], Awaitable[None]],
    options: ServeOptions,
) -> int:
    """Serve until SIGTERM: health goes SERVING only after the model is loaded and warmed up.

    Returns the process's exit status: 0 after a signal, EXIT_DEVICE_POISONED once the engine lost
    its device (device_errors.py): health goes NOT_SERVING at once, the engine has failed its
    requests, and the non-zero exit makes the orchestrator start a fresh process."""
    engine = servicer.engine
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    poisoned = asyncio.Event()

    def on_fatal(_error: BaseException) -> None:
        loop.call_soon_threadsafe(poisoned.set)

    engine.add_fatal_listener(on_fatal)
    engine.start()
    server = build_server(options.max_message_bytes, options.max_streams)
    service_full_name = servicer.add_to_server(server)
    health = add_health_and_reflection(server, [service_full_name])

    async def on_poisoned() -> None:
        await poisoned.wait()
        servicer.draining = True  # new streams: UNAVAILABLE
        await set_serving(health, False)
        print(json.dumps({"event": "device_poisoned", "stage": servicer.stage.value}), flush=True)
        stop.set()

    watcher = asyncio.create_task(on_poisoned())
    credentials = server_credentials(options.tls_cert, options.tls_key, options.tls_client_ca)
    # Both ports are bound before the server starts: a busy one ends the process with its one-line
    # error and nothing running yet to tear down.
    metrics_port = start_metrics_http(options.metrics_port, options.metrics_host, servicer.metrics.registry)
    port = add_port(server, f"{options.host}:{options.port}", credentials)
    await server.start()
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
    servicer.speed.reset()  # warm-up steps (compilation, first allocations) are no measure of serving
    freeze_startup_heap()  # the model's objects: never walked by the cycle collector again
    await set_serving(health, True)
    print(json.dumps({"event": "serving", "stage": stage, "port": port}), flush=True)

    async def on_drain() -> None:
        # New streams get UNAVAILABLE while health answers NOT_SERVING; running ones finish.
        servicer.draining = True
        log.info("%s draining: %d streams open", stage, servicer.open_streams)
        # Poisoned: the engine already failed every request; their streams end on their own soon.
        grace = POISONED_GRACE_S if poisoned.is_set() else options.grace_seconds
        deadline = loop.time() + grace
        while servicer.open_streams and loop.time() < deadline:
            await asyncio.sleep(0.05)

    try:
        await serve_until_signal(server, health, 1.0, on_drain, stop=stop)
    finally:
        watcher.cancel()
    engine.stop()
    if engine.poisoned is not None:
        print(json.dumps({"event": "stopped", "stage": stage, "reason": "device_poisoned"}), flush=True)
        sys.stdout.flush()
        return EXIT_DEVICE_POISONED
    print(json.dumps({"event": "stopped", "stage": stage}), flush=True)
    sys.stdout.flush()
    return 0
