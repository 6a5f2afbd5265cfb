"""lower_cpu_priority: every thread of the process, those already running and those started later,
gets the nice value; the session's autogroup too, but only for a session leader. Run in child
processes, so this one keeps its nice."""

from __future__ import annotations

import subprocess
import sys

import pytest

from omnistream.service.cpu_priority import lower_cpu_priority

CHILD = """
import os, sys, threading
from pathlib import Path
from omnistream.service.cpu_priority import lower_cpu_priority
# a thread that exists before (as the lifeline's watchdog does in every service)
before, go, nices = threading.Event(), threading.Event(), {}
def early():
    before.set()
    go.wait()
    nices["early"] = os.getpriority(os.PRIO_PROCESS, 0)
first = threading.Thread(target=early)
first.start()
before.wait()
changes = lower_cpu_priority(int(sys.argv[1]), Path(sys.argv[2]))
go.set()
first.join()
later = threading.Thread(target=lambda: nices.setdefault("later", os.getpriority(os.PRIO_PROCESS, 0)))
later.start()
later.join()
print(os.getpriority(os.PRIO_PROCESS, 0), nices["early"], nices["later"], "|".join(changes))
"""


def _child(tmp_path, nice: int, new_session: bool) -> tuple[list[str], str]:
    autogroup = tmp_path / "autogroup"
    autogroup.write_text("/autogroup-1 nice 0\n")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(nice), str(autogroup)],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=new_session,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split(" ", 3), autogroup.read_text()


def test_a_session_leader_lowers_its_threads_and_its_autogroup(tmp_path):
    (own, early, later, changes), autogroup = _child(tmp_path, 5, new_session=True)
    assert (own, early, later) == ("5", "5", "5")
    assert changes.strip() == "nice 0 -> 5|autogroup nice 5"
    assert autogroup == "5"


def test_a_process_sharing_its_shells_session_leaves_the_autogroup_alone(tmp_path):
    (own, early, later, changes), autogroup = _child(tmp_path, 7, new_session=False)
    assert (own, early, later) == ("7", "7", "7")
    assert changes.strip() == "nice 0 -> 7"
    assert autogroup == "/autogroup-1 nice 0\n"


def test_nice_zero_changes_nothing_and_out_of_range_is_refused(tmp_path):
    (own, early, later, changes), _ = _child(tmp_path, 0, new_session=True)
    assert (own, early, later, changes.strip()) == ("0", "0", "0", "")
    for bad in (-1, 20):
        with pytest.raises(ValueError, match="nice must be in"):
            lower_cpu_priority(bad)
