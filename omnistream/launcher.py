"""Start services as child processes and wait until they report SERVING on gRPC health.

Used by `omnistream up` and by the integration tests: each service prints one JSON line with its
bound ports (so port 0 works), and readiness is the standard health check, never a sleep.
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
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


@dataclass
class ServiceProcess:
    name: str
    proc: subprocess.Popen
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
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


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
        from omnistream.security import channel_credentials

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
        return reply.status


def wait_serving(
    address: str, timeout: float, proc: subprocess.Popen | None = None, tls: ClientTLS | None = None
) -> None:
    """Poll gRPC health until SERVING (TLS when `tls` is given)."""
    deadline = time.monotonic() + timeout
    with tls.channel(address) if tls is not None else grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"service at {address} exited with {proc.returncode}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
    raise TimeoutError(f"service at {address} not SERVING after {timeout}s")


def start_service(
    name: str, args: list[str], timeout: float = 180.0, env: dict | None = None, tls: ClientTLS | None = None
) -> ServiceProcess:
    """Run `omnistream <args>` and return once it is SERVING; on failure nothing is left running."""
    return start_services({name: args}, timeout, env, tls=tls)[name]


def start_services(
    specs: dict[str, list[str]],
    timeout: float = 180.0,
    env: dict | None = None,
    *,
    tls: ClientTLS | None = None,
    wrappers: dict[str, list[str]] | None = None,
) -> dict[str, ServiceProcess]:
    """Start several services at once (model loading overlaps), then wait for each to be SERVING.

    `tls`: the services serve TLS; the health wait uses these client credentials. `wrappers`: a
    command to run a service's process under, per name (e.g. `ip netns exec NS`).
    """
    started: dict[str, tuple[ServiceProcess, threading.Event]] = {}
    try:
        for name, args in specs.items():
            started[name] = _spawn(name, args, env, (wrappers or {}).get(name, []))
        for name, (service, ready) in started.items():
            if not ready.wait(timeout) or not service.port:
                raise RuntimeError(f"{name} did not report its port: {service.lines[-5:]}")
            wait_serving(service.address, timeout, service.proc, tls)
    except BaseException:
        for service, _ in started.values():
            service.kill()
        raise
    return {name: service for name, (service, _) in started.items()}


def _spawn(
    name: str, args: list[str], env: dict | None, wrapper: list[str]
) -> tuple[ServiceProcess, threading.Event]:
    cmd = [*wrapper, sys.executable, "-m", "omnistream.cli", *args]
    proc_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=proc_env, start_new_session=True
    )
    service = ServiceProcess(name, proc)
    ready = threading.Event()
    threading.Thread(target=_reader, args=(service, ready), daemon=True).start()
    return service, ready
