"""Child processes that die with the process that started them, even when it is killed with SIGKILL.

Every launcher of the project (`omnistream up`, the test fixtures, the benchmark) starts services
in their own sessions, so that a Ctrl-C in the terminal reaches only the supervisor, which then
stops them in order. That also cuts every tie the kernel would otherwise make between them: a
supervisor that gets SIGHUP without handling it, or SIGKILL, or the OOM killer, leaves the services
re-parented to init and holding their ports. This module ties them back, from both ends:

* The parent starts children with `spawn`, which puts its pid in $OMNISTREAM_PARENT_PID.
* The child calls `bind_to_parent()` first thing in its own main (every `omnistream` command does,
  before torch or gRPC are imported). Setting it in the service process itself, not in a
  preexec_fn, is what makes it hold under wrappers (`ip netns exec NS ...`): the setting belongs to
  the process that ends up being the service (a wrapper must exec the service, as `ip netns exec`,
  `env` and `nice` do, not fork it). It asks Linux for SIGTERM when its parent dies
  (prctl PR_SET_PDEATHSIG): SIGTERM, not SIGKILL, so the service drains as on any other stop. Then
  it checks that its parent is still the expected pid: a parent that died before prctl left the
  child re-parented, and no signal will ever come, so the child exits at once.
* A watchdog thread in the child waits on a pidfd of the parent. Once the parent is gone it sends
  the SIGTERM itself where prctl was not available, and ends the process hard after
  ORPHAN_GRACE_S: nobody is left to wait for a drain (an idle service drains at once anyway).

Why the main thread matters: the kernel sends the parent-death signal when the *thread* that forked
the child exits, not the process. A child forked from a short-lived thread (an executor worker,
`asyncio.to_thread`) would be told to stop while its supervisor is alive and well. `spawn`
therefore forks on the main thread when called there (it lives as long as the process) and
otherwise hands the fork to one daemon thread kept for the life of the process. A watched pipe
would not care about threads, but its write end is inherited by anything the parent forks without
exec (and then never reaches EOF) and some wrappers close inherited descriptors. The pidfd watch
follows the process, not a thread, and backs the prctl signal up: it is what guarantees the exit.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

PARENT_PID_ENV = "OMNISTREAM_PARENT_PID"
PARENT_DEATH_SIGNAL = signal.SIGTERM
ORPHAN_GRACE_S = 5.0  # after its parent died, a service that has not drained by then is killed
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_INTERVAL_S = 0.5  # where no pidfd is available

# A fork for the spawner thread to run, and where its child (or its exception) goes.
_Fork = tuple[Callable[[], "subprocess.Popen[Any]"], "Future[subprocess.Popen[Any]]"]
_spawn_queue: queue.SimpleQueue[_Fork] | None = None
_spawn_lock = threading.Lock()


# --- the parent's side ------------------------------------------------------------------------------


def spawn(cmd: list[str], env: dict[str, str] | None = None, **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(cmd, ...)` for a child that must not outlive this process.

    The child must call `bind_to_parent()` (every `omnistream` command does). `env` defaults to this
    process's environment; the parent pid is added to it.
    """
    child_env = {**(os.environ if env is None else env), PARENT_PID_ENV: str(os.getpid())}
    return _on_lasting_thread(lambda: subprocess.Popen(cmd, env=child_env, **popen_kwargs))


def _on_lasting_thread(fork: Callable[[], subprocess.Popen[Any]]) -> subprocess.Popen[Any]:
    """Run `fork` on a thread that lives as long as this process (see the module docstring)."""
    if threading.current_thread() is threading.main_thread():
        return fork()
    done: Future[subprocess.Popen[Any]] = Future()
    _spawner().put((fork, done))
    return done.result()


def _spawner() -> queue.SimpleQueue[_Fork]:
    global _spawn_queue
    with _spawn_lock:
        if _spawn_queue is None:
            _spawn_queue = queue.SimpleQueue()
            threading.Thread(
                target=_serve_forks, args=(_spawn_queue,), name="omnistream-spawner", daemon=True
            ).start()
        return _spawn_queue


def _serve_forks(requests: queue.SimpleQueue[_Fork]) -> None:
    while True:
        fork, done = requests.get()
        try:
            done.set_result(fork())
        except BaseException as exc:  # handed to the caller, which re-raises it
            done.set_exception(exc)


# --- the child's side -------------------------------------------------------------------------------


def bind_to_parent() -> None:
    """Die with the parent named in $OMNISTREAM_PARENT_PID; nothing to do when it is not set.

    Call first thing in a child's main. The variable is taken out of the environment so that
    processes this one starts are tied to it, not to its parent.
    """
    value = os.environ.pop(PARENT_PID_ENV, "")
    if not value.isdigit():
        return
    parent = int(value)
    pidfd = _open_pidfd(parent)
    direct = os.getppid() == parent
    armed = direct and _set_parent_death_signal(PARENT_DEATH_SIGNAL)
    if (direct and os.getppid() != parent) or (not direct and not _alive(parent)):
        raise SystemExit(f"omnistream: parent process {parent} is gone; not starting")
    threading.Thread(
        target=_watch, args=(parent, pidfd, direct, armed), name="omnistream-lifeline", daemon=True
    ).start()


def _set_parent_death_signal(sig: signal.Signals) -> bool:
    """prctl(PR_SET_PDEATHSIG, sig) through libc; False where that is not available (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # this process's own symbols: libc is among them
        status: int = libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        return status == 0
    except (OSError, AttributeError):
        return False


def _open_pidfd(pid: int) -> int | None:
    """A pidfd of `pid` (readable once it exits), or None (no pidfd_open, or already gone).

    Opened before the parent check in `bind_to_parent`: if the parent is still ours after the open,
    the pidfd is known to refer to it and not to a later process that reused its pid.
    """
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_gone(parent: int, pidfd: int | None, direct: bool) -> None:
    """Block until `parent` has exited."""
    if pidfd is not None:
        select.select([pidfd], [], [])
        return
    while os.getppid() == parent if direct else _alive(parent):
        time.sleep(POLL_INTERVAL_S)


def _watch(parent: int, pidfd: int | None, direct: bool, armed: bool) -> None:
    """Once the parent is gone: make sure SIGTERM came, then end the process after the grace time."""
    _wait_gone(parent, pidfd, direct)
    _silence_orphaned_stdout()
    with contextlib.suppress(OSError):  # one write: the services of a stack all say it at once
        os.write(2, f"omnistream: parent process {parent} exited; stopping\n".encode())
    if not armed:
        os.kill(os.getpid(), PARENT_DEATH_SIGNAL)
    time.sleep(ORPHAN_GRACE_S)
    os.kill(os.getpid(), signal.SIGKILL)


def _silence_orphaned_stdout() -> None:
    """A stdout pipe was read by the parent, now gone: writes would fail with EPIPE (a stack trace
    on the terminal from a stopping service), so they go to /dev/null instead."""
    with contextlib.suppress(OSError):
        if stat.S_ISFIFO(os.fstat(1).st_mode):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.close(devnull)
