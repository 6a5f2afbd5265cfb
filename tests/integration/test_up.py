"""`omnistream up` (what `make run` runs) serves, and the curl command it prints works."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest


def test_up_serves_and_printed_curl_works(tiny_model_dir):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "omnistream.cli",
            "up",
            "--model",
            tiny_model_dir,
            "--http-port",
            "0",
            "--grpc-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        text = "".join(lines)
        match = re.search(r"^\s*(curl .*?)(?=\n\s*\n)", text, re.S | re.M)
        assert match, text
        curl = match.group(1).replace("\\\n", " ")
        reply = subprocess.run(
            ["bash", "-c", curl + " --max-time 120 -s"], capture_output=True, text=True, timeout=150
        )
        assert reply.returncode == 0, reply.stderr
        assert '"content"' in reply.stdout and '"audio"' in reply.stdout
        assert reply.stdout.rstrip().endswith("data: [DONE]")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:  # a failed test: SIGTERM lets `up` stop its children first
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


pytestmark = pytest.mark.timeout(300)
