"""`omnistream up`'s own logic without starting anything: a busy port, a cancelled start, the
command lines it builds for each stage and the gateway, what it prints once serving.

Its supervision of started processes (stand-ins stopped however a start ends, the drain, another
interpreter) is tests/integration/test_up_supervision.py; the real stack is tests/integration/test_up.py.
"""

from __future__ import annotations

import argparse
import itertools
import socket
import sys
import threading
from collections.abc import Iterator

import pytest

from omnistream.cli import launcher, up
from omnistream.cli.launcher import ServiceProcess, StartCancelled, StartError, start_services
from omnistream.cli.usage import usage_text
from tests.up_stubs import signal_handlers_restored, up_args


@pytest.fixture(autouse=True)
def restore_signal_handlers() -> Iterator[None]:
    with signal_handlers_restored():
        yield


def test_busy_port_is_one_line_and_starts_nothing(monkeypatch, capsys):
    monkeypatch.setattr(up, "start_stack", lambda *a, **k: pytest.fail("started despite a busy port"))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert up.run_up(up_args(grpc_port=port)) == 1
    err = capsys.readouterr().err
    assert err == (
        f"omnistream up: port {port} is already in use (another omnistream up still running?): "
        "stop it or pass --http-port/--grpc-port\n"
    )


def test_cancelled_start_spawns_nothing(monkeypatch):
    monkeypatch.setattr(launcher, "_spawn", lambda *a: pytest.fail("spawned after cancel"))
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(StartCancelled):
        start_services({"thinker": ["serve", "thinker"]}, cancel=cancel)


def _captured_specs(monkeypatch) -> list[dict[str, list[str]]]:
    """The stage specs each `start_stack` call would start (it stops there, StartCancelled)."""
    seen: list[dict[str, list[str]]] = []

    def capture(specs, cancel=None, **kw):
        seen.append(specs)
        raise StartCancelled()

    monkeypatch.setattr(up, "start_services", capture)
    return seen


def test_prefill_chunk_reaches_the_thinker_and_the_talkers(monkeypatch):
    """`up --prefill-chunk` is a stage flag of the stages that prefill prompts (not code2wav's)."""
    seen = _captured_specs(monkeypatch)
    with pytest.raises(StartCancelled):
        up.start_stack("m", {}, talker_replicas=2, prefill_chunk=64)
    specs = seen[0]
    for name in ("thinker", "talker-0", "talker-1"):
        assert specs[name][-2:] == ["--prefill-chunk", "64"], specs[name]
    assert "--prefill-chunk" not in specs["code2wav-0"]
    args = argparse.ArgumentParser()
    up.add_arguments(args)
    assert args.parse_args(["--model", "m"]).prefill_chunk == 512
    with pytest.raises(SystemExit):
        args.parse_args(["--model", "m", "--prefill-chunk", "0"])


def test_prefix_cache_size_reaches_the_thinker_and_the_talkers_only_when_given(monkeypatch):
    seen = _captured_specs(monkeypatch)
    for gib in (None, 0.0):
        with pytest.raises(StartCancelled):
            up.start_stack("m", {}, prefix_cache_gib=gib)
    default, off = seen
    assert "--prefix-cache-gib" not in [arg for spec in default.values() for arg in spec]
    assert off["thinker"][-2:] == off["talker-0"][-2:] == ["--prefix-cache-gib", "0.0"]
    assert "--prefix-cache-gib" not in off["code2wav-0"]
    args = argparse.ArgumentParser()
    up.add_arguments(args)
    assert args.parse_args(["--model", "m", "--prefix-cache-gib", "2"]).prefix_cache_gib == 2.0


def test_up_refuses_stages_that_do_not_fit_their_shared_gpu_before_starting(
    monkeypatch, capsys, tiny_model_dir
):
    import torch

    monkeypatch.setattr(up, "start_stack", lambda *a, **k: pytest.fail("started although it cannot fit"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1 << 30, 2 << 30))  # 1 of 2 GiB free
    parser = argparse.ArgumentParser()
    up.add_arguments(parser)
    args = parser.parse_args(
        ["--model", tiny_model_dir, "--device", "cuda:0", "--http-port", "0", "--grpc-port", "0"]
    )
    assert up.run_up(args) == 1
    # Its one line (transformers may warn about the tiny config before it, once per process).
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("omnistream up:")]
    assert len(err) == 1 and err[0].startswith("omnistream up: cuda:0 would hold thinker ")
    assert "talker" in err[0] and "code2wav" in err[0]


def test_usage_points_to_the_playground_first():
    text = usage_text("127.0.0.1", 8000, 50051)
    pointers = [line.strip() for line in text.splitlines()[2:] if line.strip()]
    assert pointers[0].startswith("Playground: http://127.0.0.1:8000/ ")
    assert text.index("Playground:") < text.index("omnistream chat") < text.index("curl")


def test_a_vllm_thinker_runs_with_the_vllm_environments_python(monkeypatch, tmp_path):
    """`up --thinker-backend vllm`: the thinker alone gets `--backend vllm` and the other python."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    seen = []

    def capture(specs, cancel=None, pythons=None):
        seen.append((specs, pythons))
        raise StartCancelled()

    monkeypatch.setattr(up, "start_services", capture)
    with pytest.raises(StartCancelled):
        up.start_stack("m", {}, thinker_backend="vllm", vllm_python_path=str(python))
    specs, pythons = seen[0]
    assert specs["thinker"][-2:] == ["--backend", "vllm"]
    assert "--backend" not in specs["talker-0"] and "--backend" not in specs["code2wav-0"]
    assert pythons == {"thinker": str(python)}
    args = argparse.ArgumentParser()
    up.add_arguments(args)
    assert args.parse_args(["--model", "m"]).thinker_backend == "transformers"


def test_a_missing_vllm_python_is_refused_before_anything_starts(monkeypatch, tmp_path):
    monkeypatch.delenv(up.VLLM_PYTHON_ENV, raising=False)
    started = []
    monkeypatch.setattr(up, "start_services", lambda *a, **kw: started.append(a))
    with pytest.raises(StartError, match="make setup-vllm"):
        up.start_stack("m", {}, thinker_backend="vllm", vllm_python_path=str(tmp_path / "none"))
    assert started == []
    monkeypatch.setenv(up.VLLM_PYTHON_ENV, sys.executable)
    assert up.vllm_python() == sys.executable


def test_the_thinker_alone_runs_at_a_lower_cpu_priority(monkeypatch):
    """`up` shares one machine's cores between the stages: the thinker gets `--nice` (default 5),
    the audio stages keep theirs; `--thinker-nice 0` asks for equal priority, 20 is refused."""
    seen = []

    def capture(specs, cancel=None, **kw):
        seen.append(specs)
        raise StartCancelled()

    monkeypatch.setattr(up, "start_services", capture)
    for kwargs, expected in (({}, str(up.DEFAULT_THINKER_NICE)), ({"thinker_nice": 0}, "0")):
        with pytest.raises(StartCancelled):
            up.start_stack("m", {}, **kwargs)
        specs = seen.pop()
        at = specs["thinker"].index("--nice")
        assert specs["thinker"][at + 1] == expected
        assert "--nice" not in specs["talker-0"] and "--nice" not in specs["code2wav-0"]
    args = argparse.ArgumentParser()
    up.add_arguments(args)
    assert args.parse_args(["--model", "m"]).thinker_nice == 5
    with pytest.raises(SystemExit):
        args.parse_args(["--model", "m", "--thinker-nice", "20"])


def _gateway_command(monkeypatch, given: list[str], **stack) -> list[str]:
    """The `serve gateway` command `up` with `given` starts (after its stages), `stack(parsed)`
    giving start_stack's keyword arguments."""
    specs_seen: list[dict[str, list[str]]] = []

    def fake_start(specs, cancel=None, **kw):
        specs_seen.append(specs)
        if "gateway" in specs:
            raise StartCancelled()
        return {name: ServiceProcess(name, None, port=1000 + i) for i, name in enumerate(specs)}

    monkeypatch.setattr(up, "start_services", fake_start)
    args = argparse.ArgumentParser()
    up.add_arguments(args)
    parsed = args.parse_args(["--model", "m", *given])
    keywords = {name: value(parsed) for name, value in stack.items()}
    with pytest.raises(StartCancelled):
        up.start_stack("m", {}, gateway_flags=up.admission_flags(parsed), **keywords)
    return specs_seen[-1]["gateway"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ([], []),
        (["--no-audio-hold"], ["--no-audio-hold"]),
        (
            ["--audio-hold-margin", "0.5", "--queue-timeout", "30"],
            ["--audio-hold-margin", "0.5", "--queue-timeout", "30.0"],
        ),
    ],
)
def test_admission_flags_reach_the_gateway_as_serve_gateway_names_them(monkeypatch, given, expected):
    """`up --no-audio-hold / --audio-hold-margin / --queue-timeout` start the gateway with the flags of
    the same names, which `serve gateway` parses to the same settings."""
    from gateway.main_args import add_arguments as gateway_arguments

    gateway_spec = _gateway_command(monkeypatch, given, audio_hold=lambda parsed: parsed.audio_hold)
    flags = [f for f in gateway_spec if ("hold" in f and f.startswith("--")) or f == "--queue-timeout"]
    assert flags == [f for f in expected if f.startswith("--")]
    for flag, value in itertools.pairwise(expected):
        if flag.startswith("--") and not value.startswith("--"):
            assert gateway_spec[gateway_spec.index(flag) + 1] == value
    gateway_parser = argparse.ArgumentParser()
    gateway_arguments(gateway_parser)
    served = gateway_parser.parse_args(gateway_spec[2:])  # past "serve gateway"
    assert served.audio_hold is (False if "--no-audio-hold" in given else None)
    if "--queue-timeout" in given:
        assert served.queue_timeout == 30.0 and served.audio_hold_margin == 0.5


@pytest.mark.parametrize(
    ("given", "expected"),
    [([], {}), (["--max-concurrency", "32", "--max-queue", "0"], {"max_concurrency": 32, "max_queue": 0})],
)
def test_the_gateways_caps_are_passed_only_when_given(monkeypatch, given, expected):
    """Without `--max-concurrency` / `--max-queue`, `up`'s gateway derives its limits from the
    stages (no cap on its command line); given, `serve gateway` gets them under the same names."""
    from gateway.main import config_from_args
    from gateway.main_args import add_arguments as gateway_arguments

    gateway_spec = _gateway_command(monkeypatch, given, max_concurrency=lambda parsed: parsed.max_concurrency)
    gateway_parser = argparse.ArgumentParser()
    gateway_arguments(gateway_parser)
    served = config_from_args(gateway_parser.parse_args(gateway_spec[2:]))
    caps = {"max_concurrency": served.max_concurrency, "max_queue": served.max_queue}
    assert caps == {"max_concurrency": None, "max_queue": None} | expected
