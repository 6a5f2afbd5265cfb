"""RTF and TTFP through a real `omnistream up`, as a user's client sees them: the stack is a child
process on loopback with ephemeral ports, waited on through its gateway's /ready, measured with the
benchmark's own gRPC client and statistics (omnistream/bench/clients.py, stats.py: the metrics as
`vllm bench serve` defines them), and always stopped.

`omnistream up` as a user starts it (its defaults: admission, batch sizes, the talker's graphs on
CUDA), only the model, device and dtype given, so the numbers are the product's, not a tuned rig's.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

SERVING = re.compile(r"omnistream is serving: REST http://\S+:(\d+)\s+gRPC \S+:(\d+)")
STOP_TIMEOUT_S = 60.0  # `up` drains the gateway, then the stages: idle, that is a second or two


@dataclass(frozen=True)
class ServedSizes:
    """Each request: a random prompt of `input_len` ids, `output_len` text tokens and `audio_frames`
    codec frames (80 ms each; EOS ignored, so every answer is as long); each cell sends
    max(concurrency, `min_requests`) requests, after `warmup` unmeasured ones."""

    input_len: int = 100
    output_len: int = 64
    audio_frames: int = 100
    min_requests: int = 3
    warmup: int = 1


class UpStack:
    """`omnistream up` in a child process (it dies with this one, omnistream/cli/lifeline.py): entered,
    it is serving and its gateway answers /ready; exited, it is stopped (SIGINT, then killed)."""

    def __init__(self, model: str, device: str, dtype: str, log: Path, start_timeout_s: float) -> None:
        self.command = [sys.executable, "-m", "omnistream.cli.main", "up", "--model", model]
        self.command += ["--device", device, "--dtype", dtype, "--host", "127.0.0.1"]
        self.command += ["--http-port", "0", "--grpc-port", "0"]
        self.log = log
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.http_port = self.grpc_port = 0
        self._lines: queue.Queue[str | None] = queue.Queue()

    def __enter__(self) -> UpStack:
        from omnistream.cli.lifeline import spawn

        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as err:
            self.proc = spawn(
                self.command, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
            )
        assert self.proc.stdout is not None
        threading.Thread(target=_pump, args=(self.proc.stdout, self._lines), daemon=True).start()
        try:
            deadline = time.monotonic() + self.start_timeout_s
            self.http_port, self.grpc_port = self._serving(deadline)
            self._wait_ready(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _serving(self, deadline: float) -> tuple[int, int]:
        """The ports `up` prints once its gateway is ready (it picked them: port 0)."""
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if line is None:
                raise RuntimeError(f"omnistream up exited before serving: {self._tail()}")
            if match := SERVING.search(line):
                return int(match.group(1)), int(match.group(2))
        raise TimeoutError(f"omnistream up not serving after {self.start_timeout_s:.0f} s: {self._tail()}")

    def _wait_ready(self, deadline: float) -> None:
        """Health, not a sleep: poll the gateway's /ready until it says 200."""
        url = f"http://127.0.0.1:{self.http_port}/ready"
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
                urllib.request.urlopen(url, timeout=2) as reply,
            ):
                if reply.status == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"the gateway's /ready did not answer 200 in time: {self._tail()}")

    def _tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text()[-2000:]
        return ""

    def stop(self) -> None:
        """SIGINT (what Ctrl-C sends: `up` drains the gateway, then the stages), then SIGKILL of the
        process started here if it has not ended; its services follow it (lifeline)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _pump(stdout: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stdout:
        lines.put(line)
    lines.put(None)


def _cell(results: list[Any], duration: float) -> dict[str, Any]:
    """One concurrency's numbers: RTF and TTFP (mean and median over the answered requests), what
    failed or was refused, and the wall time of the cell."""
    from omnistream.bench.stats import summarize

    summary = summarize(results, duration)

    def stat(key: str, which: str, digits: int) -> float | None:
        value = summary[key][which]
        return None if value is None else round(value, digits)

    return {
        "requests": len(results),
        "completed": summary["completed"],
        "failed": summary["failed"],
        "refused": summary["refused"],
        "errors": summary["errors"],
        "rtf": stat("rtf", "mean", 4),
        "rtf_median": stat("rtf", "median", 4),
        "ttfp_ms": stat("ttfp_ms", "mean", 1),
        "ttfp_ms_median": stat("ttfp_ms", "median", 1),
        "audio_s_per_request": round(summary["audio_seconds_per_request"], 3),
        "wall_s": round(duration, 2),
    }


async def measure(
    address: str, model: str, concurrencies: list[int], sizes: ServedSizes, deadline: float
) -> dict[str, dict[str, Any]]:
    """Each concurrency's cell against the gateway at `address` (gRPC), async chunk on (the default);
    a cell that would start past `deadline` (time.monotonic) is skipped, one running past it is cut."""
    from omnistream.bench.clients import GrpcGatewayClient, Workload, run_cell
    from omnistream.models.family import family_for

    family = family_for(model)
    config, tokenizer = family.load_config(model), family.load_tokenizer(model)
    workload = Workload(sizes.output_len, sizes.audio_frames, True)
    client = GrpcGatewayClient(address)
    cells: dict[str, dict[str, Any]] = {}
    try:
        for prompt in family.random_prompts(config, tokenizer, sizes.warmup, sizes.input_len, 999):
            await client.run(prompt, workload, True)
        for conc in concurrencies:
            left = deadline - time.monotonic()
            if left <= 0:
                cells[str(conc)] = {"skipped": "the time budget was spent"}
                continue
            count = max(conc, sizes.min_requests)
            prompts = family.random_prompts(config, tokenizer, count, sizes.input_len, conc)
            try:
                async with asyncio.timeout(left):
                    results, duration = await run_cell(client, prompts, workload, True, conc, float("inf"))
            except TimeoutError:
                cells[str(conc)] = {"error": f"cut at the time budget ({left:.0f} s left when it started)"}
                continue
            cells[str(conc)] = _cell(results, duration)
    finally:
        await client.close()
    return cells


def served(
    model: str,
    device: str,
    dtype: str,
    concurrencies: list[int],
    sizes: ServedSizes,
    log: Path,
    deadline: float,
) -> dict[str, Any]:
    """Start `omnistream up` on `model`, measure every concurrency, stop it; how long the start and
    the cells took beside the cells."""
    started = time.perf_counter()
    with UpStack(model, device, dtype, log, max(deadline - time.monotonic(), 1.0)) as stack:
        start_s = time.perf_counter() - started
        cells = asyncio.run(measure(stack.grpc_address, model, concurrencies, sizes, deadline))
    return {
        "device": device,
        "dtype": dtype,
        "start_s": round(start_s, 2),
        "workload": {
            "input_len": sizes.input_len,
            "output_len": sizes.output_len,
            "audio_frames": sizes.audio_frames,
        },
        "cells": cells,
    }
