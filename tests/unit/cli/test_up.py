"""`omnistream up`'s supervision without the model: busy ports, failed and interrupted starts.

The services here are stand-ins (`sleep` in Python) in ServiceProcess records, so what is checked is
only up's own logic: whatever was started gets stopped, whichever way the start ends.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from omnistream.cli import launcher, up
from omnistream.cli.launcher import ServiceProcess, StartCancelled, StartError, start_services, stop_services
from omnistream.cli.usage import usage_text


@pytest.fixture(autouse=True)
def restore_signal_handlers() -> Iterator[None]:
    """run_up installs handlers for the process; the test process must get its own back."""
    saved = {sig: signal.getsignal(sig) for sig in up.STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _stand_in(name: str, *, ignore_sigterm: bool = False) -> ServiceProcess:
    code = "import signal, time\n"
    if ignore_sigterm:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(600)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"  # its handlers are in place
    return ServiceProcess(name, proc)


def _args(http_port: int = 0, grpc_port: int = 0) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    up.add_arguments(parser)
    return parser.parse_args(
        ["--model", "unused", "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    )


def test_busy_port_is_one_line_and_starts_nothing(monkeypatch, capsys):
    monkeypatch.setattr(up, "start_stack", lambda *a, **k: pytest.fail("started despite a busy port"))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert up.run_up(_args(grpc_port=port)) == 1
    err = capsys.readouterr().err
    assert err == (
        f"omnistream up: port {port} is already in use (another omnistream up still running?): "
        "stop it or pass --http-port/--grpc-port\n"
    )


def test_failed_start_stops_what_was_started(monkeypatch, capsys):
    started: list[ServiceProcess] = []

    def start_stack(model, services, **_kwargs):
        services["thinker"] = _stand_in("thinker")
        started.append(services["thinker"])
        raise StartError("gateway exited with 1 before listening")

    monkeypatch.setattr(up, "start_stack", start_stack)
    try:
        assert up.run_up(_args()) == 1
        assert started[0].proc.poll() is not None
        err = capsys.readouterr().err
        assert err == "omnistream up: gateway exited with 1 before listening; stopped everything\n"
    finally:
        started[0].kill()


@pytest.mark.parametrize("sig", up.STOP_SIGNALS, ids=lambda s: s.name)
def test_signal_while_starting_stops_what_was_started(monkeypatch, sig):
    started: list[ServiceProcess] = []

    def start_stack(model, services, *, cancel: threading.Event, **_kwargs):
        services["thinker"] = _stand_in("thinker")
        started.append(services["thinker"])
        os.kill(os.getpid(), sig)  # as from the terminal, while the stack is still starting
        if not cancel.wait(60):
            pytest.fail(f"{sig.name} did not cancel the start")
        raise StartCancelled()

    monkeypatch.setattr(up, "start_stack", start_stack)
    try:
        assert up.run_up(_args()) == 0
        assert started[0].proc.poll() is not None
    finally:
        started[0].kill()


def test_cancelled_start_spawns_nothing(monkeypatch):
    monkeypatch.setattr(launcher, "_spawn", lambda *a: pytest.fail("spawned after cancel"))
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(StartCancelled):
        start_services({"thinker": ["serve", "thinker"]}, cancel=cancel)


def test_stop_services_drains_together_and_kills_the_stubborn():
    polite, stubborn = _stand_in("talker-0"), _stand_in("code2wav-0", ignore_sigterm=True)
    try:
        stop_services([polite, stubborn], timeout=1.0)
        assert polite.proc.returncode == -signal.SIGTERM
        assert stubborn.proc.returncode == -signal.SIGKILL
    finally:
        polite.kill()
        stubborn.kill()


def test_prefill_chunk_reaches_the_thinker_and_the_talkers(monkeypatch):
    """`up --prefill-chunk` is a stage flag of the stages that prefill prompts (not code2wav's)."""
    seen: list[dict[str, list[str]]] = []

    def capture(specs, cancel=None, **kw):
        seen.append(specs)
        raise StartCancelled()

    monkeypatch.setattr(up, "start_services", capture)
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


def test_another_python_runs_this_source_tree(monkeypatch):
    """The launcher puts this tree first on the other interpreter's PYTHONPATH, so the vLLM
    environment runs the same code as the rest of the stack."""
    seen = {}

    def spawn(cmd, env, **kw):
        seen.update(cmd=cmd, env=env)
        return subprocess.Popen([sys.executable, "-c", "pass"], stdout=subprocess.PIPE, text=True)

    monkeypatch.setattr(launcher, "spawn", spawn)
    service, _ = launcher._spawn("thinker", ["serve", "thinker"], None, [], "/opt/other/python")
    service.proc.wait(10)
    root = os.path.dirname(os.path.dirname(os.path.abspath(launcher.__file__)))
    assert seen["cmd"][:3] == ["/opt/other/python", "-m", "omnistream.cli.main"]
    assert seen["env"]["PYTHONPATH"].split(os.pathsep)[0] == root


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
    with pytest.raises(StartCancelled):
        up.start_stack(
            "m", {}, audio_hold=parsed.audio_hold, gateway_flags=up.admission_flags(parsed)
        )
    gateway_spec = specs_seen[-1]["gateway"]
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
