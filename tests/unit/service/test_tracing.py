"""omnistream/service/tracing.py: off unless a flag or the OTEL_* environment names a collector, the
kill switches, the service name, a bounded shutdown against a dead collector, and the trace context
through gRPC metadata and HTTP headers.

No global tracer provider is installed here (that is once per process, and the other tests run in
this one): the provider is built and shut down locally, and `setup_tracing` is only checked off."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from omnistream.service import tracing
from omnistream.service.tracing import (
    EXPORT_TIMEOUT_S,
    Tracing,
    build_provider,
    checked_endpoint,
    endpoint_flag,
    extract_headers,
    extract_metadata,
    inject_metadata,
    setup_tracing,
    tracing_config,
)

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"


def test_off_without_a_flag_or_an_endpoint_in_the_environment(monkeypatch):
    assert tracing_config("gateway", None, {}) is None
    assert tracing_config("gateway", None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ""}) is None  # empty: unset
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    before = trace.get_tracer_provider()
    assert setup_tracing("thinker") is None
    assert trace.get_tracer_provider() is before  # nothing installed: the API's no-op tracer stays
    assert not trace.get_tracer("t").start_span("s").is_recording()


def test_the_environment_turns_it_on_the_traces_endpoint_first():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://all:4317"}
    config = tracing_config("talker", None, env)
    assert config is not None
    assert (config.endpoint, config.service_name, config.role) == (
        "http://all:4317",
        "omnistream-talker",
        "talker",
    )
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = "http://traces:4317"
    assert tracing_config("talker", None, env).endpoint == "http://traces:4317"


def test_the_flag_wins_over_the_environment():
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://env:4317"}
    assert tracing_config("gateway", "http://flag:4317", env).endpoint == "http://flag:4317"
    assert tracing_config("gateway", "http://flag:4317", {}).endpoint == "http://flag:4317"


@pytest.mark.parametrize(
    "switch",
    [{"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_TRACES_EXPORTER": "NONE"}, {"OTEL_SDK_DISABLED": "true"}],
)
def test_the_kill_switches_turn_it_off_whatever_else_says(switch):
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://env:4317", **switch}
    assert tracing_config("gateway", None, env) is None
    assert tracing_config("gateway", "http://flag:4317", env) is None


def test_otlp_is_the_one_exporter_another_name_is_warned_about(caplog):
    assert tracing_config("gateway", "http://c:4317", {"OTEL_TRACES_EXPORTER": "otlp"}) is not None
    assert tracing_config("gateway", "http://c:4317", {"OTEL_TRACES_EXPORTER": "zipkin"}) is not None
    assert "zipkin is not supported" in caplog.text


def test_service_name_scheme_and_timeout():
    plain = tracing_config("code2wav", "http://127.0.0.1:4317", {})
    assert plain.service_name == "omnistream-code2wav" and plain.insecure
    assert plain.timeout_s == EXPORT_TIMEOUT_S  # short: a dead collector holds nothing for long
    named = tracing_config("code2wav", "https://c.example:4317", {"OTEL_SERVICE_NAME": "voice"})
    assert named.service_name == "voice" and named.role == "code2wav" and not named.insecure
    timed = tracing_config("code2wav", "http://c:4317", {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "5"})
    assert timed.timeout_s is None  # the exporter reads the environment's own


@pytest.mark.parametrize("bad", ["127.0.0.1:4317", "grpc://c:4317", "http://", "c"])
def test_an_endpoint_says_its_scheme(bad):
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        checked_endpoint(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        endpoint_flag(bad)
    with pytest.raises(ValueError):
        tracing_config("gateway", bad, {})
    # The environment's: a warning, and the service starts untraced.
    assert tracing_config("gateway", None, {"OTEL_EXPORTER_OTLP_ENDPOINT": bad}) is None


def test_every_service_command_takes_the_flag():
    from omnistream.cli.main import build_parser

    parser = build_parser()
    for argv in (
        ["serve", "thinker", "--model", "m"],
        ["serve", "code2wav", "--model", "m"],
        ["serve", "gateway"],
        ["up", "--model", "m"],
    ):
        assert parser.parse_args(argv).otlp_traces_endpoint is None
        given = parser.parse_args([*argv, "--otlp-traces-endpoint", "http://127.0.0.1:4317"])
        assert given.otlp_traces_endpoint == "http://127.0.0.1:4317"


def test_up_hands_the_endpoint_to_every_service(monkeypatch):
    from omnistream.cli import up

    started: dict[str, list[str]] = {}
    monkeypatch.setattr(up, "start_services", lambda specs, **_: started.update(specs) or {})
    monkeypatch.setattr(up, "wait_ready", lambda *_a, **_k: None)
    services: dict = {}
    with pytest.raises(KeyError):  # the fake start_services adds no gateway to look up
        up.start_stack("m", services, otlp_traces_endpoint="http://127.0.0.1:4317")
    assert set(started) == {"thinker", "talker-0", "code2wav-0", "gateway"}
    for name, argv in started.items():
        assert argv[argv.index("--otlp-traces-endpoint") + 1] == "http://127.0.0.1:4317", name


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_provider_names_its_service_and_stops_in_time_with_a_dead_collector():
    config = tracing_config("thinker", f"http://127.0.0.1:{_closed_port()}", {})
    provider, exporter = build_provider(config)
    attributes = provider.resource.attributes
    assert attributes["service.name"] == "omnistream-thinker" and attributes["omnistream.role"] == "thinker"
    for i in range(5):
        provider.get_tracer("test").start_span(f"span-{i}").end()  # queued, never exported
    started = time.monotonic()
    assert not Tracing(provider, exporter, config).shutdown(timeout_s=0.5)  # nobody took them
    assert time.monotonic() - started < 0.5 + tracing.INTERRUPTED_JOIN_S + 0.5


def test_the_trace_context_crosses_grpc_metadata_and_http_headers():
    parent = SpanContext(TRACE_ID, SPAN_ID, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    metadata = inject_metadata(trace.set_span_in_context(NonRecordingSpan(parent)))
    assert ("traceparent", TRACEPARENT) in metadata
    for carried in (
        extract_metadata((*metadata, ("x-bin", b"\x00"))),
        extract_headers({"Traceparent": TRACEPARENT, "Content-Type": "application/json"}),
    ):
        got = trace.get_current_span(carried).get_span_context()
        assert (got.trace_id, got.span_id, got.is_remote) == (TRACE_ID, SPAN_ID, True)
    assert extract_headers({}) is None and extract_metadata(()) is None
    # Nothing to carry (tracing off: the no-op span): no metadata at all.
    assert inject_metadata(trace.set_span_in_context(trace.INVALID_SPAN)) == ()


def test_the_module_is_light_at_import():
    """The command-line parsers import it for `endpoint_flag`: no OpenTelemetry at import time."""
    probe = "import sys, omnistream.service.tracing; print(any('opentelemetry' in m for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
