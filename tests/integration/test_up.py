"""`omnistream up` (what `make run` runs): it serves, the curl command it prints works, and it never
leaves a service behind: not after SIGHUP (the terminal closed), not after SIGKILL, not when its
ports are taken, not when stopped while still starting.

Every `up` here gets a mark in its environment that all its services inherit, so "everything it
started" is found through /proc even after the services were re-parented (tests/procs.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from omnistream.cli.lifeline import spawn
from omnistream.service.ports import port_in_use
from tests.procs import kill_all, marked_pids, wait_until

MARK = "OMNISTREAM_TEST_UP_MARK"
SERVICES = 4  # thinker, talker, code2wav, gateway
START_TIMEOUT_S = 180.0
GONE_TIMEOUT_S = 60.0  # generous: every service is idle, so its drain is immediate
SERVING = re.compile(r"omnistream is serving: REST http://[^:]+:(\d+)\s+gRPC [^:]+:(\d+)")


@dataclass
class Up:
    proc: subprocess.Popen
    mark: str
    stderr: Path
    lines: queue.Queue = field(default_factory=queue.Queue)

    def pids(self) -> list[int]:
        """`up` and every service it started that is still alive."""
        return marked_pids(MARK, self.mark)

    def wait_for(self, pattern: re.Pattern | str, timeout: float = START_TIMEOUT_S) -> tuple[re.Match, str]:
        """Read stdout until a line matches; the match and everything read so far."""
        seen: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if line is None:
                break
            seen.append(line)
            if match := re.search(pattern, line):
                return match, "".join(seen)
        raise AssertionError(f"no {pattern!r} from up: {''.join(seen)}\n{self.stderr.read_text()}")


def _pump(stdout, lines: queue.Queue) -> None:
    for line in stdout:
        lines.put(line)
    lines.put(None)


@contextmanager
def run_up(tmp_path: Path, model: str, *args: str) -> Iterator[Up]:
    """`omnistream up` as `make run` starts it; afterwards whatever of it is left gets killed."""
    mark = secrets.token_hex(8)
    stderr = tmp_path / f"up-{mark}.stderr"
    with stderr.open("w") as err:
        proc = spawn(
            [sys.executable, "-m", "omnistream.cli.main", "up", "--model", model, *args],
            {**os.environ, MARK: mark},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    up = Up(proc, mark, stderr)
    threading.Thread(target=_pump, args=(proc.stdout, up.lines), daemon=True).start()
    try:
        yield up
    finally:
        kill_all([proc.pid, *up.pids()])
        proc.wait(10)


def _serving(up: Up) -> tuple[int, int, str]:
    """Wait until `up` prints its usage text: (http port, grpc port, the text)."""
    match, _ = up.wait_for(SERVING)
    _, text = up.wait_for("Ctrl-C stops everything")
    assert len(up.pids()) == 1 + SERVICES, up.pids()
    return int(match.group(1)), int(match.group(2)), match.string + text


def _all_gone(up: Up, *ports: int) -> bool:
    return not up.pids() and not any(port_in_use("127.0.0.1", p) for p in ports)


def _thread_nices(pid: int) -> set[int]:
    """The nice value of every thread of `pid` (/proc/PID/task/TID/stat, field 19)."""
    nices = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            nices.add(int((task / "stat").read_text().rpartition(")")[2].split()[16]))
    return nices


def _cpu_priorities_hold(up: Up) -> None:
    """The thinker and every one of its threads run at nice 5 (and so does its session's autogroup,
    where the kernel has them); the audio stages and the gateway keep nice 0."""
    seen = {}
    for pid in up.pids():
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"serve" in argv:
                seen[argv[argv.index(b"serve") + 1].decode()] = pid
    assert set(seen) == {"thinker", "talker", "code2wav", "gateway"}, seen
    assert _thread_nices(seen["thinker"]) == {5}
    for stage in ("talker", "code2wav", "gateway"):
        assert _thread_nices(seen[stage]) == {0}, stage
    autogroup = Path(f"/proc/{seen['thinker']}/autogroup")
    if autogroup.exists():
        assert autogroup.read_text().split()[-1] == "5", autogroup.read_text()


CURL_SEED = 5
CURL_AUDIO_FRAMES = 24


def _curl_works(text: str) -> None:
    match = re.search(r"^\s*(curl .*?)(?=\n\s*\n)", text, re.S | re.M)
    assert match, text
    curl = match.group(1).replace("\\\n", " ")
    # Two fields for this test's checkpoint, whose answers never end by themselves (the one `make run`
    # serves does end them). Seeded: unseeded, its talker now and then samples its end at the first
    # frame, and an answer without audio is right but not what this checks. A bounded speech: seed 5
    # speaks to the default limit, 2,048 frames (24 s on an idle 2-core machine, 10 MB of events),
    # which a loaded machine can stretch past curl's --max-time.
    body = re.search(r"-d '(\{.*\})'", curl)
    assert body, curl
    bounded = {**json.loads(body.group(1)), "seed": CURL_SEED, "max_audio_frames": CURL_AUDIO_FRAMES}
    curl = curl.replace(body.group(1), json.dumps(bounded))
    reply = subprocess.run(
        ["bash", "-c", curl + " --max-time 120 -s"], capture_output=True, text=True, timeout=150
    )
    assert reply.returncode == 0, reply.stderr
    # with audio, as OpenAI: the text as `audio.transcript` deltas (content null), then the data
    assert '"transcript"' in reply.stdout and '"data"' in reply.stdout and '"content": null' in reply.stdout
    assert reply.stdout.rstrip().endswith("data: [DONE]")


def _playground_served(text: str) -> None:
    """The first address the banner gives is the playground page, and the gateway serves it."""
    match = re.search(r"Playground: (http://\S+)", text)
    assert match, text
    with urllib.request.urlopen(match.group(1), timeout=30) as reply:
        assert reply.headers["Content-Type"].startswith("text/html")
        assert b"/playground/static/app.js" in reply.read()


def _chat_works(grpc_port: int, http_port: int, tmp_path) -> None:
    """`omnistream chat` against the stack `up` serves: its WAV holds the client's samples and its
    transcript is the REST text, for the same seeded request."""
    from omnistream.audio.wav import read_float32_wav
    from omnistream.client import Client, RestClient

    seeded = {"seed": 3, "max_tokens": 8, "max_audio_frames": 12}
    out = tmp_path / "chat.wav"
    chat = [sys.executable, "-m", "omnistream.cli.main", "chat", "Hello"]
    chat += ["--gateway", f"127.0.0.1:{grpc_port}"]
    chat += ["--output", str(out), "--seed", "3", "--max-tokens", "8", "--max-audio-frames", "12"]
    # Its text as printed, read as bytes: text mode would turn a "\r" in a random checkpoint's answer
    # into "\n".
    done = subprocess.run(chat, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    printed = done.stdout.decode("utf-8")
    with Client(f"127.0.0.1:{grpc_port}") as client:
        answer = client.complete("Hello", **seeded)
    with RestClient(f"http://127.0.0.1:{http_port}") as rest:
        assert printed.rstrip("\n") == rest.complete("Hello", **seeded).text == answer.text
    written, rate = read_float32_wav(out)
    assert rate == answer.sample_rate and written.shape == answer.audio.shape
    # Two requests of one seed, so the same codes; the audio to float32 rounding only: this stack
    # runs float32, and the first chunks' sizes follow the machine's speed (a loaded machine makes
    # other windows, which round otherwise).
    np.testing.assert_allclose(written, answer.audio, rtol=0, atol=1e-5)


def test_up_serves_refuses_busy_ports_and_stops_on_sighup(tiny_model_dir, tmp_path):
    """One stack, three checks: the printed curl works; a second `up` on the same ports fails with
    one clear line and starts nothing; SIGHUP (the terminal closed) stops every service and frees
    every port."""
    with run_up(tmp_path, tiny_model_dir, "--http-port", "0", "--grpc-port", "0") as first:
        http_port, grpc_port, text = _serving(first)
        _cpu_priorities_hold(first)
        _playground_served(text)
        _curl_works(text)
        _chat_works(grpc_port, http_port, tmp_path)

        for flags in (["--http-port", str(http_port)], ["--grpc-port", str(grpc_port)]):
            other = "--grpc-port" if flags[0] == "--http-port" else "--http-port"
            with run_up(tmp_path, tiny_model_dir, *flags, other, "0") as second:
                assert second.proc.wait(60) == 1
                assert wait_until(lambda second=second: not second.pids(), GONE_TIMEOUT_S), second.pids()
                assert second.stderr.read_text() == (
                    f"omnistream up: port {flags[1]} is already in use (another omnistream up still "
                    "running?): stop it or pass --http-port/--grpc-port\n"
                )

        first.proc.send_signal(signal.SIGHUP)
        assert first.proc.wait(GONE_TIMEOUT_S) == 0
        assert wait_until(lambda: _all_gone(first, http_port, grpc_port), GONE_TIMEOUT_S), first.pids()


def test_up_killed_with_sigkill_takes_its_services_along(tiny_model_dir, tmp_path):
    with run_up(tmp_path, tiny_model_dir, "--http-port", "0", "--grpc-port", "0") as up:
        http_port, grpc_port, _ = _serving(up)
        up.proc.kill()
        up.proc.wait(10)
        assert wait_until(lambda: _all_gone(up, http_port, grpc_port), GONE_TIMEOUT_S), up.pids()


def test_up_stopped_while_starting_leaves_nothing(tiny_model_dir, tmp_path):
    """Ctrl-C while the stages are still loading: what was started is stopped too."""
    with run_up(tmp_path, tiny_model_dir, "--http-port", "0", "--grpc-port", "0") as up:
        assert wait_until(lambda: len(up.pids()) >= 1 + 3, START_TIMEOUT_S), up.pids()
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(GONE_TIMEOUT_S) == 0
        assert wait_until(lambda: not up.pids(), GONE_TIMEOUT_S), up.pids()


def test_services_report_a_busy_port_in_one_line(tiny_model_dir):
    """The race `up`'s own check cannot close (a port taken after it looked): the service that
    cannot bind says so in one line and exits non-zero."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = str(holder.getsockname()[1])
        stage = ["serve", "code2wav", "--model", tiny_model_dir, "--port", port]
        gateway = ["serve", "gateway", "--http-port", port, "--grpc-port", "0"]
        gateway += ["--thinker", "127.0.0.1:1", "--talker", "127.0.0.1:1", "--code2wav", "127.0.0.1:1"]
        procs = {
            args[1]: spawn(
                [sys.executable, "-m", "omnistream.cli.main", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            for args in (stage, gateway)
        }
        try:
            for name, flag in (("code2wav", "--port"), ("gateway", "--http-port")):
                out, err = procs[name].communicate(timeout=START_TIMEOUT_S)
                assert procs[name].returncode == 1, out + err
                assert err == (
                    f"omnistream serve {name}: port {port} is already in use (another omnistream still "
                    f"running?): stop it or pass another {flag}\n"
                )
        finally:
            for proc in procs.values():
                proc.kill()
                proc.wait(10)


pytestmark = pytest.mark.timeout(600)
