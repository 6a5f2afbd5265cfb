"""The runs of `omnistream bench --conversation`: a fresh stack per run, the cache settings A B B A,
the workloads in each run, and the JSON and markdown they end in."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnistream.bench.conversation.summary import check_targets, ratios, summarize_runs
from omnistream.bench.conversation.tables import report
from omnistream.bench.conversation.workloads import (
    SENTENCES,
    Answer,
    Row,
    Turn,
    concurrent_rest,
    realtime_conversation,
    rest_conversation,
)

if TYPE_CHECKING:
    from omnistream.bench.clients import RestGatewayClient

WORKLOADS = ("realtime", "rest", "concurrent")
REAL_SHAPED_DIR = Path(".cache") / "real-shaped-model"


def plan(repeats: int) -> list[str]:
    """The cache settings in run order: on, off, off, on, ... (A B B A)."""
    from omnistream.bench.cells import interleave

    return list(interleave(["on", "off"], repeats))


def resolve_models(given: str, default_model: str) -> list[tuple[str, str]]:
    """`--conversation-models` as (label, checkpoint directory): "tiny" (DEFAULT_TINY_DIR),
    "real-shaped" (the tiny build with the real code predictor's depth, built once under .cache),
    or a directory (labelled by its name; "" : `--model`)."""
    from omnistream.cli.common import DEFAULT_TINY_DIR

    out = []
    for name in [n.strip() for n in (given or default_model).split(",") if n.strip()]:
        if name == "tiny" or Path(name) == DEFAULT_TINY_DIR:
            out.append(("tiny", str(DEFAULT_TINY_DIR)))
        elif name == "real-shaped":
            out.append(("real-shaped", str(REAL_SHAPED_DIR)))
        else:
            out.append((Path(name).name, name))
    labels = [label for label, _ in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"a checkpoint is given twice: {given}")
    return out


def _ensure_model(label: str, directory: str) -> str:
    from omnistream.cli.common import ensure_default_model

    if label == "real-shaped" and Path(directory) == REAL_SHAPED_DIR:
        from omnistream.bench.op_counts import real_shaped_model

        return real_shaped_model(directory)
    ensure_default_model(directory)
    return directory


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def padded(done: list[Turn], turns: int, error: str) -> list[Row]:
    """A conversation's turns, those it never reached (it failed: `error`) counted as failed."""
    return [t.as_dict() for t in done] + [
        Turn(turn=i, error=error).as_dict() for i in range(len(done) + 1, turns + 1)
    ]


async def _warm_up(
    client: RestGatewayClient, base_url: str, answer: Answer, workloads: Sequence[str]
) -> dict[str, str]:
    """A REST request and a one-turn realtime session (other words than the measured ones)."""
    errors = {}
    try:
        await client.chat(answer.rest_input([{"role": "user", "content": "Warm up: say anything."}]))
    except Exception as exc:
        errors["warm-up rest"] = _error(exc)
    if "realtime" in workloads:
        try:
            await realtime_conversation(base_url, 1, answer, offset=len(SENTENCES) // 2 + 3)
        except Exception as exc:
            errors["warm-up realtime"] = _error(exc)
    return errors


async def one_run(model: str, cache: str, args: argparse.Namespace, workloads: Sequence[str]) -> Row:
    """A fresh stack with the cache `cache` ("on": the default budget, "off": 0), the workloads."""
    from omnistream.bench.clients import RestGatewayClient
    from omnistream.cli.launcher import ServiceProcess
    from omnistream.cli.up import start_stack, stop_stack
    from omnistream.models.family import model_info

    answer = Answer(args.conversation_max_tokens, args.conversation_audio_frames, args.seed)
    services: dict[str, ServiceProcess] = {}
    extra: dict[str, Any] = {}
    if args.prefill_chunk is not None:
        extra["prefill_chunk"] = args.prefill_chunk
    if args.thinker_nice is not None:
        extra["thinker_nice"] = args.thinker_nice
    t0 = time.perf_counter()
    # the machine's load average (1, 5, 15 min) around the run: this machine is shared
    run: dict[str, Any] = {"cache": cache, "load_before": os.getloadavg()}
    client = None
    try:
        import shlex

        gateway = await asyncio.to_thread(
            start_stack,
            model,
            services,
            max_concurrency=max(16, 2 * args.conversation_concurrency),
            gateway_flags=shlex.split(args.gateway_args),
            prefix_cache_gib=None if cache == "on" else 0.0,
            **extra,
        )
        run["stack_start_s"] = time.perf_counter() - t0
        base_url = f"http://127.0.0.1:{gateway.http_port}"
        rate = model_info(model).sample_rate
        client = RestGatewayClient(base_url, None, rate)
        # A workload that fails (the gateway closed the session...) is recorded; the next one runs.
        errors = run["errors"] = await _warm_up(client, base_url, answer, workloads)
        turns = args.conversation_turns
        for name in ("realtime", "rest"):
            if name not in workloads:
                continue
            done: list[Turn] = []
            try:
                if name == "realtime":
                    await realtime_conversation(
                        base_url, turns, answer, out=done, turn_seconds=args.conversation_turn_seconds
                    )
                else:
                    await rest_conversation(client, turns, answer, out=done)
            except Exception as exc:
                errors[name] = _error(exc)
            run[name] = padded(done, turns, errors.get(name, "not reached"))
        if "concurrent" in workloads:
            try:
                summary, per_conversation = await concurrent_rest(
                    client, args.conversation_concurrency, args.conversation_concurrent_turns, answer
                )
                run["concurrent"] = summary
                run["concurrent_turns"] = [[t.as_dict() for t in c] for c in per_conversation]
            except Exception as exc:
                errors["concurrent"] = _error(exc)
        run["wall_s"] = time.perf_counter() - t0
        run["load_after"] = os.getloadavg()
        return run
    finally:
        if client is not None:
            await client.close()
        await asyncio.to_thread(stop_stack, services)


def _failed_turns(run: Row) -> int:
    """Failed turns of a run, a concurrency run that failed as a whole counted as one."""
    failed = sum(1 for w in ("realtime", "rest") for t in run.get(w) or [] if t.get("error"))
    broken = "concurrent" in run.get("errors", {})
    return failed + int((run.get("concurrent") or {}).get("failed", 0)) + broken


def workloads_of(given: str) -> list[str]:
    names = [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        raise ValueError(
            f"--conversation-workloads takes a comma list of {', '.join(WORKLOADS)}, got {given!r}"
        )
    return names


async def run_conversation(args: argparse.Namespace) -> int:
    from omnistream.bench.machine import machine_info

    try:
        models = resolve_models(args.conversation_models, args.model)
        workloads = workloads_of(args.conversation_workloads)
    except ValueError as exc:
        print(f"omnistream bench: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    machine = machine_info()  # at the start: what the runs' fresh stacks loaded, unless it changed
    order = plan(args.repeats)
    checkpoints: dict[str, Row] = {}
    for label, directory in models:
        model = await asyncio.to_thread(_ensure_model, label, directory)
        runs = []
        for i, cache in enumerate(order):
            print(
                f"conversation bench: {label}, cache {cache} (run {i + 1} of {len(order)})", file=sys.stderr
            )
            run = await one_run(model, cache, args, workloads)
            run["run"] = i
            runs.append(run)
            load = f"load {run['load_before'][0]:.1f} -> {run['load_after'][0]:.1f}"
            print(f"  {run['wall_s']:.0f} s, {_failed_turns(run)} failed turns, {load}", file=sys.stderr)
            for name, error in run["errors"].items():
                print(f"  {name}: {error}", file=sys.stderr)
        checkpoints[label] = {"model": model, "runs": runs, "summary": summarize_runs(runs)}
    summary = {label: c["summary"] for label, c in checkpoints.items()}
    targets = check_targets(summary, args.conversation_throughput_tolerance)
    text = report(summary, targets)
    payload = {
        "machine": machine,
        "commit_at_end": machine_info()["commit"],  # another value: the tree changed during the run
        "args": {k: (v if v != float("inf") else "inf") for k, v in vars(args).items() if k != "func"},
        "wall_seconds": time.perf_counter() - t0,
        "order": order,
        "checkpoints": checkpoints,
        "ratios": ratios(summary),
        "targets": [t.as_dict() for t in targets],
    }
    from omnistream.bench import report as bench_report

    bench_report.write_json(out_dir / "conversation.json", payload)
    (out_dir / "conversation.md").write_text(text)
    print(text)
    print(f"wrote conversation.json, conversation.md to {out_dir}")
    failed = sum(_failed_turns(r) for c in checkpoints.values() for r in c["runs"])
    return 1 if failed else 0
