"""omnistream.cli.lifeline: children started with `spawn` die with their parent, however it dies.

An integration test (it was tests/unit/cli/): each test starts parent and child processes and
kills them, one under a network namespace (`ip netns`, root only)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from omnistream.cli.lifeline import ORPHAN_GRACE_S, PARENT_PID_ENV, spawn
from tests.procs import alive, kill_all, wait_until

# A child as every omnistream command is: bind_to_parent() first, then its work: echo stdin, or
# (--sleep) just stay, so that nothing but the tie can end it.
CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from omnistream.cli.lifeline import bind_to_parent
    bind_to_parent()
    if "--ignore-sigterm" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    if "--sleep" in sys.argv:
        time.sleep(600)
    for line in sys.stdin:
        print(line.strip(), flush=True)
    """
)
# A supervisor that starts the command in argv[1] (JSON) in its own session, as the launchers do,
# reports its pid, then waits to be killed.
PARENT = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from omnistream.cli.lifeline import spawn
    child = spawn(json.loads(sys.argv[1]), stdin=subprocess.DEVNULL, start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(600)
    """
)
ROOT = str(Path(__file__).resolve().parents[2])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": ROOT}


def _parent_and_child(*child_args: str, wrapper: tuple[str, ...] = ()) -> tuple[subprocess.Popen, int]:
    """A PARENT process and the pid of its sleeping CHILD (under `wrapper`), once the child is ready."""
    cmd = [*wrapper, sys.executable, "-c", CHILD, "--sleep", *child_args]
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, json.dumps(cmd)], stdout=subprocess.PIPE, text=True, env=_env()
    )
    child = int(parent.stdout.readline())  # the wrapper's pid: it execs the child, so the same
    assert parent.stdout.readline().strip() == "ready"  # the child shares the parent's stdout
    return parent, child


def _kill_parent_and_wait_for_child(parent: subprocess.Popen, child: int) -> None:
    try:
        assert alive(child)
        parent.kill()
        parent.wait(10)
        assert wait_until(lambda: not alive(child), timeout=ORPHAN_GRACE_S + 55)
    finally:
        kill_all([child])
        parent.kill()
        parent.wait(10)


@pytest.mark.parametrize("child_args", [(), ("--ignore-sigterm",)], ids=["drains", "ignores-sigterm"])
def test_child_dies_when_its_parent_is_killed(child_args):
    """SIGKILL of the parent: SIGTERM reaches the child at once; one that ignores it is killed after
    the grace time. Either way it is gone well within the deadline."""
    _kill_parent_and_wait_for_child(*_parent_and_child(*child_args))


@pytest.fixture
def netns() -> Iterator[str]:
    """A bare network namespace, as tests/integration/test_multihost.py wraps services in."""
    name = f"omni-lifeline-{secrets.token_hex(3)}"
    try:
        made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("the `ip` command (iproute2) is not installed")
    if made.returncode != 0:
        pytest.skip(f"`ip netns add` is not permitted here: {made.stderr.strip()}")
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def test_child_under_a_wrapper_dies_with_its_parent(netns):
    """The tie is made by the service process itself, so it holds under `ip netns exec NS`."""
    _kill_parent_and_wait_for_child(*_parent_and_child(wrapper=("ip", "netns", "exec", netns)))


def test_child_whose_parent_is_already_gone_does_not_start():
    """The race prctl cannot close: the parent died before the child asked to be signalled."""
    gone = subprocess.Popen(["true"])
    gone.wait(10)
    env = {**_env(), PARENT_PID_ENV: str(gone.pid)}
    result = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert f"parent process {gone.pid} is gone" in result.stderr
    assert "ready" not in result.stdout


def test_spawn_from_a_thread_that_ends_does_not_kill_the_child():
    """The parent-death signal follows the forking *thread*: spawn must fork on one that lasts.

    The worker waits for the child to be ready (its death signal armed) before it ends: a thread
    that ended earlier would have handed the child to another thread before prctl, unnoticed."""
    started: list[subprocess.Popen] = []

    def start_and_wait_ready() -> None:
        child = spawn(
            [sys.executable, "-c", CHILD], _env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        started.append(child)
        assert child.stdout.readline().strip() == "ready"

    worker = threading.Thread(target=start_and_wait_ready)
    worker.start()
    worker.join(60)
    (child,) = started
    try:
        # The OS thread is gone (not only the Python one), so its death signal would have fired.
        assert wait_until(lambda: not Path(f"/proc/self/task/{worker.native_id}").exists(), timeout=60)
        child.stdin.write("still here\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "still here"
        assert child.poll() is None
    finally:
        child.kill()
        child.wait(10)


def test_the_tie_is_not_inherited_by_grandchildren():
    """A child unsets the variable, so what it starts is tied to it, not to its own parent."""
    code = (
        "from omnistream.cli.lifeline import bind_to_parent; import os; bind_to_parent(); print(os.environ)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**_env(), PARENT_PID_ENV: str(os.getpid())},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert PARENT_PID_ENV not in result.stdout


def test_spawned_child_knows_its_parent():
    child = spawn(
        [sys.executable, "-c", f"import os; print(os.environ[{PARENT_PID_ENV!r}])"],
        _env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = child.communicate(timeout=60)
    assert int(out) == os.getpid()
