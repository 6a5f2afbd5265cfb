"""What a long prompt's prefill does to the requests already running: their inter-token latency.

In-process, per stage (thinker tokens, talker frames): `running` requests decode steadily, then one
request with a `tokens`-long prompt arrives. A step listener (engine thread) stamps every step, so a
running request's inter-token latency (ITL) is the time between the steps that gave it a token or
frame. Reported: the ITLs that ended while the long prompt was being prefilled (from its arrival to
the step that gave its first token/frame, both included), the steady ITL before it came, and the
long request's time to first output.

Runs against any checkout, also one from before chunked prefill (it only uses engine APIs that
existed then): `compare` runs this file with PYTHONPATH set to each tree, so one run measures
before and after on the same machine (`tools/prefill-itl`, `omnistream bench --long-prompt-tokens`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from omnistream.engine.engine import Engine
    from omnistream.models.qwen3_omni.talker.engine import TalkerEngine
    from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine

E = TypeVar("E", bound="Engine[Any, Any]")

# Run as a file under another tree: `python -c RUNNER this_file args...` with cwd = that tree.
RUNNER = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def _stats(samples: list[float]) -> dict[str, float | int | None]:
    if not samples:
        return {"count": 0, "max_ms": None, "p50_ms": None, "p90_ms": None, "mean_ms": None}
    ordered = sorted(samples)
    return {
        "count": len(ordered),
        "max_ms": 1e3 * ordered[-1],
        "p50_ms": 1e3 * statistics.median(ordered),
        "p90_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "mean_ms": 1e3 * statistics.fmean(ordered),
    }


class _StepClock:
    """Step listener: per running request, the step times at which its output count grew."""

    def __init__(
        self,
        running: list[Any],
        count: Callable[[Any], int],
        long_started: Callable[[], bool],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.clock = clock
        self.running = running
        self.count = count  # state -> tokens or frames so far
        self.long_started = long_started  # () -> did the long request get its first output yet
        self.last: dict[int, tuple[int, float]] = {}
        self.itls: list[tuple[float, float]] = []  # (end time, seconds)
        self.added: float | None = None
        self.first_output: float | None = None

    def __call__(self, _engine: object, _seconds: float) -> None:
        now = self.clock()
        for state in self.running:
            n = self.count(state)
            seen = self.last.get(id(state))
            if seen is not None and n > seen[0]:
                self.itls.append((now, (now - seen[1]) / (n - seen[0])))
            if seen is None or n > seen[0]:
                self.last[id(state)] = (n, now)
        if self.added is not None and self.first_output is None and self.long_started():
            self.first_output = now

    def summary(self) -> dict[str, Any]:
        assert self.added is not None and self.first_output is not None
        during = [s for t, s in self.itls if self.added < t <= self.first_output]
        before = [s for t, s in self.itls if t <= self.added]
        return {
            "itl_during_prefill": _stats(during),
            "itl_before": _stats(before),
            "long_ttft_ms": 1e3 * (self.first_output - self.added),
        }


async def _drain(out: AsyncIterable[Any]) -> None:
    async for _ in out:
        pass


async def _wait(condition: Callable[[], bool], engine: Engine[Any, Any], running: list[Any]) -> None:
    """Until `condition()` holds; polls (the engine thread mutates the states it reads)."""
    while not condition():
        if any(s.finished for s in running):
            raise RuntimeError(f"a running {engine.name} request ended early: measure with fewer tokens")
        if not engine._thread or not engine._thread.is_alive():
            raise RuntimeError(f"{engine.name} engine stopped")
        await asyncio.sleep(0.005)


def _state(engine: Engine[Any, Any], request_id: str) -> Any:
    with engine._cond:
        return engine._requests[request_id]


async def _thinker(
    engine: ThinkerEngine, short: list[int], long: list[int], running: int, warm: int
) -> dict[str, Any]:
    from omnistream.request.stage_chain import ThinkerParams

    budget = engine.max_model_len - len(short)
    outs = [engine.add_request(f"run-{i}", short, ThinkerParams(budget, True)) for i in range(running)]
    drains = [asyncio.ensure_future(_drain(out)) for out in outs]
    states = [_state(engine, f"run-{i}") for i in range(running)]
    await _wait(lambda: all(len(s.generated) >= warm for s in states), engine, states)
    long_state: list[Any] = []
    clock = _StepClock(
        states, lambda s: len(s.generated), lambda: bool(long_state and long_state[0].generated)
    )
    engine.add_step_listener(clock)
    try:
        await _wait(lambda: len(clock.itls) >= warm * running, engine, states)  # steady ITL, for reference
        clock.added = time.perf_counter()
        long_out = engine.add_request("long", long, ThinkerParams(1, True))
        long_state.append(_state(engine, "long"))
        await _drain(long_out)
        await _wait(lambda: clock.first_output is not None, engine, states)
    finally:
        engine._step_listeners.remove(clock)
        for i in range(running):
            engine.abort(f"run-{i}")
        await asyncio.gather(*drains)
    return clock.summary()


async def _talker(
    engine: TalkerEngine, short: list[int], long: list[int], running: int, warm: int
) -> dict[str, Any]:
    from omnistream.request.stage_chain import TalkerParams

    stream = list(range(5, 5 + 64))  # the thinker's tokens after the prompt (any text ids)
    frames = engine.max_model_len - len(short) - 16
    outs = []
    for i in range(running):
        outs.append(engine.add_request(f"run-{i}", TalkerParams(max_frames=frames, ignore_eos=True)))
        engine.feed(f"run-{i}", stream, True, prompt_ids=short)
    drains = [asyncio.ensure_future(_drain(out)) for out in outs]
    states = [_state(engine, f"run-{i}") for i in range(running)]
    await _wait(lambda: all(s.frames >= warm for s in states), engine, states)
    long_state: list[Any] = []
    clock = _StepClock(
        states, lambda s: s.frames, lambda: bool(long_state and _talker_started(long_state[0]))
    )
    engine.add_step_listener(clock)
    try:
        await _wait(lambda: len(clock.itls) >= warm * running, engine, states)
        clock.added = time.perf_counter()
        long_out = engine.add_request("long", TalkerParams(max_frames=1))
        long_state.append(_state(engine, "long"))
        engine.feed("long", stream, True, prompt_ids=long)
        await _drain(long_out)
        await _wait(lambda: clock.first_output is not None, engine, states)
    finally:
        engine._step_listeners.remove(clock)
        for i in range(running):
            engine.abort(f"run-{i}")
        await asyncio.gather(*drains)
    return clock.summary()


def _talker_started(state: Any) -> bool:
    """Whether the long request's first codebook-0 was chosen (through fields every checkout has)."""
    return state.pending_code0 is not None or state.frames > 0 or state.finished


async def measure(
    model: str, tokens: int, prefill_chunk: int | None = None, running: int = 2, warm: int = 8
) -> dict[str, Any]:
    """ITLs of `running` requests while a `tokens`-long prompt prefills, thinker then talker (one
    torch thread, as the services run). `prefill_chunk` None: the engines' default."""
    import torch

    from omnistream.engine.settings import EngineSettings, TalkerEngineSettings, ThinkerEngineSettings, derive
    from omnistream.models.family import family_for
    from omnistream.models.qwen3_omni.talker.engine import TalkerEngine
    from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine

    torch.set_num_threads(1)
    family = family_for(model)
    config, tokenizer = family.load_config(model), family.load_tokenizer(model)
    short, long = (
        family.random_prompts(config, tokenizer, 1, n, seed)[0] for n, seed in ((32, 1), (tokens, 2))
    )
    chunk: dict[str, Any] = {} if prefill_chunk is None else {"prefill_chunk": prefill_chunk}
    length = tokens + 512  # room for the long prompt and the running requests' output
    result: dict[str, Any] = {"tokens": tokens, "running": running, "prefill_chunk": prefill_chunk}
    # No prefix cache: the same long prompt's prefill is what is measured, each repeat.
    shared = EngineSettings(max_batch=running + 1, max_model_len=length, **chunk)
    thinker = ThinkerEngine(model, derive(ThinkerEngineSettings, shared, prefix_cache_gib=0))
    result["thinker"] = await _measured(thinker, _thinker, short, long, running, warm)
    talker = TalkerEngine(model, derive(TalkerEngineSettings, shared, prefix_cache_gib=0))
    result["talker"] = await _measured(talker, _talker, short, long, running, warm)
    return result


async def _measured(
    engine: E,
    run: Callable[[E, list[int], list[int], int, int], Awaitable[dict[str, Any]]],
    short: list[int],
    long: list[int],
    running: int,
    warm: int,
) -> dict[str, Any]:
    """`run` twice on the started `engine` (the first a warm-up); the second's numbers."""
    engine.start()
    try:
        await run(engine, short, long, running, warm)  # warm-up: first-call costs out of the way
        return await run(engine, short, long, running, warm)
    finally:
        engine.stop()


def measure_in(
    tree: str | Path, model: str, tokens: int, prefill_chunk: int | None = None, running: int = 2
) -> dict[str, Any]:
    """`measure` with the code of checkout `tree` (its omnistream and services packages), in a
    child process: how the stall looks before and after a change, on the same machine."""
    tree = Path(tree).resolve()
    argv = [
        sys.executable,
        "-c",
        RUNNER,
        str(Path(__file__).resolve()),
        "--model",
        str(Path(model).resolve()),
    ]
    argv += ["--tokens", str(tokens), "--running", str(running)]
    if prefill_chunk is not None:
        argv += ["--prefill-chunk", str(prefill_chunk)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"long-prompt measurement in {tree} failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def describe(label: str, result: dict[str, Any]) -> str:
    """One line per stage: the running requests' ITL during the long prefill and before it."""
    lines = []
    for stage, unit in (("thinker", "token"), ("talker", "frame")):
        r = result[stage]
        during, before = r["itl_during_prefill"], r["itl_before"]
        chunk = result["prefill_chunk"] or "default"
        lines.append(
            f"{label} {stage}: {result['tokens']}-token prompt, chunk {chunk}: "
            f"ITL per {unit} while it prefills max {during['max_ms']:.1f} ms, p50 {during['p50_ms']:.1f} ms "
            f"({during['count']} gaps); steady p50 {before['p50_ms']:.1f} ms; "
            f"its first {unit} after {r['long_ttft_ms']:.0f} ms"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=4000)
    p.add_argument("--running", type=int, default=2)
    p.add_argument("--prefill-chunk", type=int, default=None)
    args = p.parse_args(argv)
    result = asyncio.run(measure(args.model, args.tokens, args.prefill_chunk, args.running))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
