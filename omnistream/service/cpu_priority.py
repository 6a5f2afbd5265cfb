"""A stage's CPU priority, for stages that share a machine's cores (`omnistream serve --nice`).

Why: on a CPU host where all stages share a few cores, the thinker decodes text many times faster
than anyone reads it (and far ahead of the talker, which takes one of its tokens per codec frame),
but while it does, it holds a core the audio path needs. Measured on the 2-core machine (tiny model,
one request at a time, per-stage timestamps): in the ~0.4 s the thinker decodes an answer's text,
a Code2Wav window that needs 10 ms of CPU took up to 112-280 ms of wall time (10-66 involuntary
context switches, no page faults), so the second audio chunk came after the first had played out.
With the thinker at nice 5 the audio stages win those cores and the thinker takes what is left: no
request stalled in 2 x 32, where 1-5 of 32 did at nice 0, and text comes slower while the cores are
busy (TPOT ~4-5 instead of ~3.6 ms alone, 13-23 instead of 6-8 ms at concurrency 16; docs/
benchmarks.md, run 5). Nice only decides who waits while the cores are contended; an idle core
still runs the thinker.

Linux applies a nice value per thread, and, where autogroups are on (`kernel.sched_autogroup_
enabled`, the default of most distributions), first between sessions: each session's group gets an
equal share whatever its threads' nice. `omnistream up` starts every service in its own session,
so a service that leads its session also sets its group's nice (`/proc/self/autogroup`); one run
from a shell shares the shell's group and leaves it alone (it would slow the whole session down).
Only lowering the priority is asked for: it needs no privilege (containers included).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

MAX_NICE = 19
AUTOGROUP = Path("/proc/self/autogroup")
TASKS = Path("/proc/self/task")  # this process's threads


def lower_cpu_priority(nice: int, autogroup: Path = AUTOGROUP, tasks: Path = TASKS) -> list[str]:
    """Run this process at `nice` (0-19, 0: unchanged): every thread it has now (Linux sets a nice
    per thread) and so every thread they start later (a thread is created with its creator's).
    Call it early, before the engine and gRPC start theirs. Returns what was changed, for the
    start-up log."""
    if not 0 <= nice <= MAX_NICE:
        raise ValueError(f"nice must be in [0, {MAX_NICE}], got {nice}")
    if nice == 0:
        return []
    done = []
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice > current:
        for tid in sorted(int(entry.name) for entry in tasks.iterdir()):
            try:
                if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
            except ProcessLookupError:  # a thread that ended meanwhile
                continue
        done.append(f"nice {current} -> {nice}")
    if os.getsid(0) == os.getpid() and autogroup.exists():
        try:
            autogroup.write_text(str(nice))
            done.append(f"autogroup nice {nice}")
        except OSError as exc:  # a kernel that refuses: the thread nice still holds
            log.warning("could not set this session's autogroup nice to %d: %s", nice, exc)
    return done
