"""OpenTelemetry tracing of one process: off unless configured, batched, never in a request's way.

Every process of a deployment (the gateway, each stage) calls `setup_tracing` once at start with its
role and its `--otlp-traces-endpoint`. Tracing is on when that flag or the standard environment
(`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT`) names an OTLP/gRPC
collector; `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true` turn it off whatever else says
(the kill switch an operator reaches for without editing command lines). Off, no tracer provider is
installed: the spans the code opens are the API's no-op spans, which record nothing and cost a
function call.

On, finished spans go to a `BatchSpanProcessor`, whose own thread exports them: a request only
appends its span to a queue, so a slow or dead collector costs dropped spans (a full queue drops
the oldest), never a slower answer. The export timeout is short (`EXPORT_TIMEOUT_S` unless
`OTEL_EXPORTER_OTLP[_TRACES]_TIMEOUT` says), and `Tracing.shutdown` flushes within a bound and then
lets go: the exporter's thread is a daemon, so a process that stops never waits on a collector.

The trace context crosses processes as W3C `traceparent` (the global propagator: tracecontext and
baggage unless `OTEL_PROPAGATORS` says otherwise): in HTTP headers into the gateway, in gRPC metadata
into the gateway's API and from the gateway to each stage (`inject_metadata` / `extract_metadata`).

Light at import (the standard library only; OpenTelemetry is imported where it is used), so the
command-line parsers can take `endpoint_flag` from here without slowing `--help`.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger(__name__)

TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
DISABLED_ENV = "OTEL_SDK_DISABLED"
SERVICE_NAME_ENV = "OTEL_SERVICE_NAME"
TIMEOUT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
# Seconds one export may take, its retries included (the SDK's default is 10): a dead collector
# then holds the exporter's thread only this long per batch.
EXPORT_TIMEOUT_S = 2.0
# Seconds a stopping process gives its last spans to leave (a collector that answers takes
# milliseconds); then it stops without them.
SHUTDOWN_TIMEOUT_S = 1.0
INTERRUPTED_JOIN_S = 0.25  # then: the exporter told to stop retrying, its thread's last moment
SERVICE_PREFIX = "omnistream-"
ROLE_ATTRIBUTE = "omnistream.role"  # gateway, thinker, talker, code2wav: kept when OTEL_SERVICE_NAME renames

GrpcMetadata = tuple[tuple[str, str], ...]


def checked_endpoint(text: str) -> str:
    """An OTLP/gRPC endpoint as `http://host:port` (plaintext) or `https://host:port` (TLS): the
    scheme says which, so a bare `host:port` (which the exporter would take as TLS) is refused
    instead of exporting nowhere. ValueError (argparse's type error) otherwise."""
    parsed = urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"an OTLP endpoint is http://HOST:PORT or https://HOST:PORT, got {text!r}")
    return text


def endpoint_flag(text: str) -> str:
    """argparse type of `--otlp-traces-endpoint` (`checked_endpoint`, as a usage error)."""
    try:
        return checked_endpoint(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


ENDPOINT_SHOWN = "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT, else off"
ENDPOINT_HELP = (
    "export OpenTelemetry traces over OTLP/gRPC to this collector: http://HOST:PORT plaintext, "
    "https://HOST:PORT TLS (OTEL_TRACES_EXPORTER=none: off whatever is given)"
)


def add_endpoint_argument(p: argparse.ArgumentParser, whose: str = "") -> None:
    """`--otlp-traces-endpoint` of `serve gateway` and `up` (the stages' is their StageSettings').
    A flag, not a gateway setting: deployments configure tracing through the OTEL_* environment
    (deploy/), which every process reads alike."""
    help_text = f"{ENDPOINT_HELP}{whose} (default: {ENDPOINT_SHOWN})"
    p.add_argument("--otlp-traces-endpoint", type=endpoint_flag, default=None, metavar="URL", help=help_text)


@dataclass(frozen=True)
class TracingConfig:
    """What one process exports to: resolved from its flag and the environment (`tracing_config`)."""

    endpoint: str
    service_name: str
    role: str
    insecure: bool  # http:// endpoints: plaintext gRPC
    timeout_s: float | None  # None: the OTEL_EXPORTER_OTLP_*_TIMEOUT the exporter reads itself


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def tracing_config(
    role: str, endpoint: str | None = None, environ: Mapping[str, str] | None = None
) -> TracingConfig | None:
    """The process's tracing, or None when it is off (see the module docstring for the rules).

    `role`: gateway, thinker, talker or code2wav; the service name is `omnistream-<role>` unless
    `OTEL_SERVICE_NAME` says otherwise. `endpoint`: the `--otlp-traces-endpoint` flag (it wins over
    the environment's endpoint; a bad one is a ValueError, a bad one of the environment's a warning
    and tracing off)."""
    env = os.environ if environ is None else environ
    exporter = env.get(EXPORTER_ENV, "").strip().lower()
    if _truthy(env.get(DISABLED_ENV)) or exporter == "none":
        return None
    if exporter and exporter != "otlp":
        log.warning("%s=%s is not supported (only otlp, over gRPC): using otlp", EXPORTER_ENV, exporter)
    if endpoint:
        endpoint = checked_endpoint(endpoint)  # a flag: argparse checked it already
    else:
        endpoint = env.get(TRACES_ENDPOINT_ENV) or env.get(ENDPOINT_ENV) or None
        if not endpoint:
            return None
        try:
            endpoint = checked_endpoint(endpoint)
        except ValueError as exc:  # the environment's: observability never stops a service from starting
            log.warning("tracing off: %s", exc)
            return None
    timeout = None if any(env.get(name) for name in TIMEOUT_ENVS) else EXPORT_TIMEOUT_S
    name = env.get(SERVICE_NAME_ENV) or f"{SERVICE_PREFIX}{role}"
    return TracingConfig(endpoint, name, role, urlparse(endpoint).scheme == "http", timeout)


class Tracing:
    """The installed provider of a process, to be shut down (flushed, within a bound) when it stops."""

    def __init__(self, provider: TracerProvider, exporter: SpanExporter, config: TracingConfig) -> None:
        self.provider = provider
        self.exporter = exporter
        self.config = config

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> bool:
        """Export what is queued and stop, waiting at most `timeout_s`: the SDK's own shutdown waits
        for an export in flight, and against a dead collector that export sleeps between retries
        until the exporter itself is shut down, which the SDK does only after that wait. So it runs
        on a daemon thread, and when the time is up the exporter is shut down from here (its retries
        end at once), the thread given a last moment, and the rest dropped. True when it finished
        in time."""
        done = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        done.start()
        done.join(timeout_s)
        if done.is_alive():
            self.exporter.shutdown()
            done.join(INTERRUPTED_JOIN_S)
            log.warning(
                "tracing: the last spans did not reach %s within %.1fs", self.config.endpoint, timeout_s
            )
            return False
        return True


def build_provider(config: TracingConfig) -> tuple[TracerProvider, SpanExporter]:
    """A TracerProvider exporting to `config.endpoint` in batches, and its exporter (not installed:
    `setup_tracing`).
    `shutdown_on_exit` is off: the SDK's exit hook would wait on a dead collector unbounded; the
    process calls `Tracing.shutdown` itself."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({SERVICE_NAME: config.service_name, ROLE_ATTRIBUTE: config.role})
    # Resource.create lets OTEL_SERVICE_NAME win over the attributes given; say ours again.
    resource = resource.merge(Resource({SERVICE_NAME: config.service_name}))
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    exporter = OTLPSpanExporter(endpoint=config.endpoint, insecure=config.insecure, timeout=config.timeout_s)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider, exporter


def setup_tracing(role: str, endpoint: str | None = None) -> Tracing | None:
    """Install this process's tracer provider when tracing is configured (`tracing_config`); None
    (nothing installed, the API's no-op tracer stays) when it is not. Once per process."""
    config = tracing_config(role, endpoint)
    if config is None:
        return None
    from opentelemetry import trace

    provider, exporter = build_provider(config)
    trace.set_tracer_provider(provider)
    log.info("tracing: %s exports spans to %s", config.service_name, config.endpoint)
    return Tracing(provider, exporter, config)


def extract_headers(headers: Mapping[str, str] | None) -> Context | None:
    """The caller's trace context from HTTP headers (`traceparent`); None when it sent none."""
    if not headers:
        return None
    from opentelemetry import propagate

    return propagate.extract({k.lower(): v for k, v in headers.items()})


def extract_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> Context | None:
    """The caller's trace context from gRPC metadata (keys are lowercase there; binary ones are
    no trace context and are skipped)."""
    from opentelemetry import propagate

    carrier = {k: v for k, v in metadata or () if isinstance(v, str)}
    return propagate.extract(carrier) if carrier else None


def inject_metadata(context: Context) -> GrpcMetadata:
    """`context`'s span as gRPC metadata (`traceparent`, and `tracestate`/baggage when set)."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return tuple(carrier.items())
