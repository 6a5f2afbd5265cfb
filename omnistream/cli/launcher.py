"""Start services as child processes and wait until they report SERVING on gRPC health.

Used by `omnistream up`, the benchmark and the integration tests: each service prints one JSON line
with its bound ports (so port 0 works), and readiness is the standard health check, never a sleep.
Every service is started through `lifeline.spawn`, so it dies with the process that started it even
when that one is killed with SIGKILL (see omnistream/cli/lifeline.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]  # ships no stubs

from omnistream.cli.lifeline import spawn

WAIT_STEP_S = 0.1  # how often a wait looks at its `cancel` event


class StartError(RuntimeError):
    """A service exited, or never got ready, while starting; the message names it."""


class StartCancelled(Exception):
    """The `cancel` event of a start was set (the supervisor got a stop signal)."""


def check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise StartCancelled()


@dataclass
class ServiceProcess:
    name: str
    proc: subprocess.Popen[str]  # text mode: its stdout is read as lines
    port: int = 0
    metrics_port: int = 0
    http_port: int = 0
    host: str = "127.0.0.1"  # as reported by the service; a wildcard bind is reached on loopback
    lines: list[str] = field(default_factory=list)

    @property
    def connect_host(self) -> str:
        """Where to reach it: its bind address, or loopback for a wildcard bind."""
        return "127.0.0.1" if self.host in ("", "0.0.0.0") else "::1" if self.host == "::" else self.host

    @property
    def address(self) -> str:
        host = self.connect_host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (drain), then SIGKILL if it does not exit in time."""
        stop_services([self], timeout)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def stop_services(services: Iterable[ServiceProcess], timeout: float = 40.0) -> None:
    """SIGTERM all at once (they drain in parallel), wait up to `timeout` in all, SIGKILL the rest."""
    running = [s for s in services if s.proc.poll() is None]
    for service in running:
        with contextlib.suppress(ProcessLookupError):
            service.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for service in running:
        try:
            service.proc.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            service.kill()


def _reader(service: ServiceProcess, ready: threading.Event) -> None:
    assert service.proc.stdout is not None
    for raw in service.proc.stdout:
        line = raw.rstrip("\n")
        service.lines.append(line)
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line)
                if event.get("event") == "listening":
                    service.port = int(event.get("port", 0))
                    service.metrics_port = int(event.get("metrics_port", 0))
                    service.http_port = int(event.get("http_port", 0))
                    service.host = str(event.get("host") or service.host)
                    ready.set()
    ready.set()


@dataclass(frozen=True)
class ClientTLS:
    """What a client needs to reach a TLS service: the CA that signed it, and for mTLS a client
    certificate; `server_name` when the certificate names something other than the dialled host."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    def channel(self, address: str) -> grpc.Channel:
        from omnistream.service.security import channel_credentials

        credentials = channel_credentials(self.ca, self.cert, self.key)
        options = [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
        return grpc.secure_channel(address, credentials, options=options)


def check_health(address: str, tls: ClientTLS | None = None, timeout: float = 5.0) -> int:
    """One grpc.health.v1 Check of the overall status ("") at `address`; returns the status value."""
    channel = tls.channel(address) if tls is not None else grpc.insecure_channel(address)
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout
        )
        status: int = reply.status
        return status


def wait_serving(
    address: str,
    timeout: float,
    proc: subprocess.Popen[Any] | None = None,
    tls: ClientTLS | None = None,
    cancel: threading.Event | None = None,
) -> None:
    """Poll gRPC health until SERVING (TLS when `tls` is given); StartCancelled once `cancel` is set."""
    deadline = time.monotonic() + timeout
    with tls.channel(address) if tls is not None else grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            check_cancel(cancel)
            if proc is not None and proc.poll() is not None:
                raise StartError(f"service at {address} exited with {proc.returncode}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
    raise TimeoutError(f"service at {address} not SERVING after {timeout}s")


def start_service(
    name: str,
    args: list[str],
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
    tls: ClientTLS | None = None,
) -> ServiceProcess:
    """Run `omnistream <args>` and return once it is SERVING; on failure nothing is left running."""
    return start_services({name: args}, timeout, env, tls=tls)[name]


def start_services(
    specs: dict[str, list[str]],
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
    *,
    tls: ClientTLS | None = None,
    wrappers: dict[str, list[str]] | None = None,
    cancel: threading.Event | None = None,
    pythons: dict[str, str] | None = None,
) -> dict[str, ServiceProcess]:
    """Start several services at once (model loading overlaps), then wait for each to be SERVING.

    `tls`: the services serve TLS; the health wait uses these client credentials. `wrappers`: a
    command to run a service's process under, per name (e.g. `ip netns exec NS`; it must exec the
    service, not fork it, for the parent-death tie to hold). `cancel`: once set, the start is
    abandoned (StartCancelled). `pythons`: the interpreter to run a service with, per name (default:
    this one), e.g. the vLLM environment's for a vLLM thinker. On any failure every service started
    here is killed.
    """
    started: dict[str, tuple[ServiceProcess, threading.Event]] = {}
    try:
        for name, args in specs.items():
            check_cancel(cancel)
            python = (pythons or {}).get(name)
            started[name] = _spawn(name, args, env, (wrappers or {}).get(name, []), python)
        for service, ready in started.values():
            _wait_listening(service, ready, timeout, cancel)
            wait_serving(service.address, timeout, service.proc, tls, cancel)
    except BaseException:
        for service, _ in started.values():
            service.kill()
        raise
    return {name: service for name, (service, _) in started.items()}


def _wait_listening(
    service: ServiceProcess, ready: threading.Event, timeout: float, cancel: threading.Event | None
) -> None:
    """Until the service printed its "listening" line; StartError if it exits or times out first."""
    deadline = time.monotonic() + timeout
    while not ready.wait(WAIT_STEP_S):
        check_cancel(cancel)
        if time.monotonic() > deadline:
            raise StartError(f"{service.name} did not report its port within {timeout:.0f}s")
    if not service.port:  # its stdout closed first: it is exiting
        with contextlib.suppress(subprocess.TimeoutExpired):
            service.proc.wait(5)
        tail = f": {service.lines[-5:]}" if service.lines else ""
        raise StartError(f"{service.name} exited with {service.proc.returncode} before listening{tail}")


def _spawn(
    name: str, args: list[str], env: dict[str, str] | None, wrapper: list[str], python: str | None = None
) -> tuple[ServiceProcess, threading.Event]:
    """Start one service in its own session (a terminal's Ctrl-C reaches only the supervisor, which
    stops the services in order), tied to this process by `lifeline.spawn`. Another interpreter
    (`python`) runs this same source tree: it goes first on that process's PYTHONPATH."""
    cmd = [*wrapper, python or sys.executable, "-m", "omnistream.cli.main", *args]
    proc_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if python is not None:
        root = str(Path(__file__).resolve().parents[1])
        proc_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, proc_env.get("PYTHONPATH")) if p)
    proc = spawn(cmd, proc_env, stdout=subprocess.PIPE, stderr=None, text=True, start_new_session=True)
    service = ServiceProcess(name, proc)
    ready = threading.Event()
    threading.Thread(target=_reader, args=(service, ready), daemon=True).start()
    return service, ready
