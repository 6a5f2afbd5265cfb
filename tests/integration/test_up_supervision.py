"""`omnistream up`'s supervision of what it started, with stand-in services (`sleep` in Python) in
ServiceProcess records, so what is checked is only up's own logic: whatever was started gets
stopped, whichever way the start ends, and a stage under another interpreter runs this tree.

Here and not in tests/unit because each test starts processes (and signals the test process); the
real stack's supervision is tests/integration/test_up.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from omnistream.cli import launcher, up
from omnistream.cli.launcher import ServiceProcess, StartCancelled, StartError, stop_services
from tests.up_stubs import signal_handlers_restored, stand_in, up_args


@pytest.fixture(autouse=True)
def restore_signal_handlers() -> Iterator[None]:
    with signal_handlers_restored():
        yield


def test_failed_start_stops_what_was_started(monkeypatch, capsys):
    started: list[ServiceProcess] = []

    def start_stack(model, services, **_kwargs):
        services["thinker"] = stand_in("thinker")
        started.append(services["thinker"])
        raise StartError("gateway exited with 1 before listening")

    monkeypatch.setattr(up, "start_stack", start_stack)
    try:
        assert up.run_up(up_args()) == 1
        assert started[0].proc.poll() is not None
        err = capsys.readouterr().err
        assert err == "omnistream up: gateway exited with 1 before listening; stopped everything\n"
    finally:
        started[0].kill()


@pytest.mark.parametrize("sig", up.STOP_SIGNALS, ids=lambda s: s.name)
def test_signal_while_starting_stops_what_was_started(monkeypatch, sig):
    started: list[ServiceProcess] = []

    def start_stack(model, services, *, cancel: threading.Event, **_kwargs):
        services["thinker"] = stand_in("thinker")
        started.append(services["thinker"])
        os.kill(os.getpid(), sig)  # as from the terminal, while the stack is still starting
        if not cancel.wait(60):
            pytest.fail(f"{sig.name} did not cancel the start")
        raise StartCancelled()

    monkeypatch.setattr(up, "start_stack", start_stack)
    try:
        assert up.run_up(up_args()) == 0
        assert started[0].proc.poll() is not None
    finally:
        started[0].kill()


def test_stop_services_drains_together_and_kills_the_stubborn():
    polite, stubborn = stand_in("talker-0"), stand_in("code2wav-0", ignore_sigterm=True)
    try:
        stop_services([polite, stubborn], timeout=1.0)
        assert polite.proc.returncode == -signal.SIGTERM
        assert stubborn.proc.returncode == -signal.SIGKILL
    finally:
        polite.kill()
        stubborn.kill()


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
