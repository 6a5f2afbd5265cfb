"""The lock a builder of a checkpoint directory holds while it writes one.

Parallel test workers, or `make run` beside a test, would otherwise write the same tiny checkpoint
at once, and a reader of a half-written one loads garbage or fails. A `<directory>.lock` file beside
the directory (filelock: an OS lock, released when its holder dies) makes one process build while
the others wait and then find it built.
"""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock


def build_lock(directory: str | Path) -> FileLock:
    return FileLock(f"{Path(directory)}.lock")
