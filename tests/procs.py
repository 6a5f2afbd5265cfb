"""Processes seen through /proc (Linux; no psutil): is one alive, which ones carry a mark.

A mark is an environment variable given to a launcher: every process it starts inherits it, also
after being re-parented to init when the launcher dies, so "everything that launcher started" can
be found without knowing any pid in advance.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")


def state(pid: int) -> str | None:
    """The process's state letter (R, S, Z, ...), or None once it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0]


def alive(pid: int) -> bool:
    """Running, or at least not a zombie: a zombie holds no sockets, and init may never reap it."""
    return state(pid) not in (None, "Z", "X")


def marked_pids(name: str, value: str) -> list[int]:
    """Every live process whose environment has `name=value`."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0") and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll `predicate` until it holds or `timeout` passes; its last value. A poll that cannot reach
    a service (OSError: a refused connection, a scrape that timed out on a loaded machine) is "not
    yet", as in tests/integration/conftest.py's `wait_for`; only the last poll's error is raised."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):  # urllib's URLError and a socket timeout among them
            if predicate():
                return True
        time.sleep(interval)
    return predicate()


def kill_all(pids: list[int]) -> None:
    """SIGKILL whatever is left (a test's cleanup after a failure)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
