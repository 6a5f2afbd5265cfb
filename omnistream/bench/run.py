"""`omnistream bench`: the seed's latency table for omnistream, services vs the in-process floor.

Method: warm-up requests are excluded; each (target, mode, concurrency) cell is measured in A B B A
order across the two targets so slow drift of the machine cancels; the spread between repeated
runs is reported beside the means; the commit and the machine are recorded with every result.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnistream.bench import report
from omnistream.bench.cells import audio_holds, chunk_schedules, interleave, ratios
from omnistream.bench.chunk_cost import PromptMaker, chunk_cost
from omnistream.bench.clients import (
    BenchClient,
    GrpcGatewayClient,
    InProcessClient,
    RestGatewayClient,
    Workload,
    run_cell,
)
from omnistream.bench.machine import machine_info
from omnistream.bench.stats import merge_runs, summarize

if TYPE_CHECKING:
    from omnistream.cli.launcher import ServiceProcess
    from omnistream.pipeline import Pipeline


@dataclass(frozen=True)
class _Plan:
    """The run's flags, parsed: what runs and how."""

    targets: list[str]
    modes: list[bool]  # async chunk on/off
    concurrencies: list[int]
    schedules: list[str | None]
    holds: list[bool]
    threshold_s: float
    workload: Workload
    prefill: dict[str, Any]  # keyword arguments of the stages and pipelines (none: their default)
    nice: dict[str, Any]


def _plan(args: argparse.Namespace) -> _Plan | None:
    """The flags as a plan; None (after saying why on stderr) when they do not make one."""
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if args.audio_input_seconds and args.transport == "rest" and "services" in targets:
        print(
            "omnistream bench: the spoken-input workload runs over gRPC (drop --transport rest)",
            file=sys.stderr,
        )
        return None
    modes = [m.strip() == "async" for m in args.modes.split(",") if m.strip()]
    concurrencies = [int(c) for c in args.max_concurrency.split(",")]
    try:
        schedules = chunk_schedules(args.codec_chunk_schedules)
    except ValueError as exc:
        print(f"omnistream bench: {exc}", file=sys.stderr)
        return None
    try:
        holds = audio_holds(args.audio_hold)
    except ValueError as exc:
        print(f"omnistream bench: {exc}", file=sys.stderr)
        return None
    threshold_s = args.continuity_threshold_ms / 1000.0
    workload = Workload(
        args.output_len,
        args.audio_frames,
        not args.no_ignore_eos,
        args.initial_codec_chunk_frames,
        codec_chunk_schedule=schedules[0],
    )
    prefill = {} if args.prefill_chunk is None else {"prefill_chunk": args.prefill_chunk}
    nice = {} if args.thinker_nice is None else {"thinker_nice": args.thinker_nice}
    return _Plan(targets, modes, concurrencies, schedules, holds, threshold_s, workload, prefill, nice)


@dataclass
class _Started:
    """What a run started, to be stopped at its end whatever failed."""

    services: dict[str, ServiceProcess] = field(default_factory=dict)
    clients: dict[str, BenchClient] = field(default_factory=dict)
    pipelines: list[Pipeline] = field(default_factory=list)  # in-process targets, in start order

    async def stop(self) -> None:
        for client in self.clients.values():
            if hasattr(client, "close"):
                await client.close()
        for pipeline in self.pipelines:
            pipeline.stop()
        for service in reversed(list(self.services.values())):
            service.stop()


def _start_targets(
    args: argparse.Namespace, plan: _Plan, started: _Started, tokenizer: Any, sample_rate: int
) -> None:
    """Start the targets' services and pipelines and their clients, into `started`."""
    from omnistream.engine.settings import EngineSettings
    from omnistream.pipeline import Pipeline
    from omnistream.service.settings import build

    services, clients, holds = started.services, started.clients, plan.holds
    settings = build(EngineSettings, args)  # the pipelines': --prefill-chunk, else serve's defaults
    if "services" in plan.targets:
        if args.gateway:
            clients["services"] = GrpcGatewayClient(args.gateway)
        else:
            from omnistream.cli.up import start_gateway, start_stack

            # The gateways' admission is `omnistream up`'s default (what the stages hold,
            # gateway/admission/limits.py) unless --gateway-args sets a cap.
            flags = shlex.split(args.gateway_args)
            gateway = start_stack(
                args.model,
                services,
                audio_hold=holds[0],
                gateway_flags=flags,
                **plan.prefill,
                **plan.nice,
            )
            gateways = {holds[0]: gateway}
            for hold in holds[1:]:  # the other setting: a second gateway over the same stages
                gateways[hold] = start_gateway(
                    services,
                    name=f"gateway-hold-{'on' if hold else 'off'}",
                    gateway_flags=flags,
                    audio_hold=hold,
                )
            for hold in holds:
                name = "services" if hold else "services[no-hold]"
                clients[name] = (
                    RestGatewayClient(f"http://127.0.0.1:{gateways[hold].http_port}", tokenizer, sample_rate)
                    if args.transport == "rest"
                    else GrpcGatewayClient(gateways[hold].address)
                )
    if "in-process" in plan.targets:
        pipeline = Pipeline(args.model, settings).start()
        started.pipelines.append(pipeline)
        clients["in-process"] = InProcessClient(pipeline)
    if "in-process-recompute" in plan.targets:  # the previous Code2Wav decode, as a baseline
        baseline = Pipeline(args.model, settings, code2wav_decode="recompute").start()
        clients["in-process-recompute"] = InProcessClient(baseline)
        started.pipelines.append(baseline)


async def _measure(
    args: argparse.Namespace, plan: _Plan, clients: dict[str, BenchClient], make_prompts: PromptMaker
) -> list[dict[str, Any]]:
    """Warm each target up, then run every cell (A B B A); one row per (target, mode, concurrency)."""
    from tqdm import tqdm  # type: ignore[import-untyped]  # no stubs

    order: list[str] = [
        t for t in ("in-process", "in-process-recompute", "services", "services[no-hold]") if t in clients
    ]
    warm = make_prompts(max(args.warmup, 1), args.input_len, args.seed + 999)
    for name in order:
        for prompt in warm[: args.warmup]:
            await clients[name].run(prompt, plan.workload, True)
    runs: dict[tuple[str, bool, int], list[dict[str, Any]]] = {}
    # One group per workload; within a group each schedule is a target of its own, interleaved
    # with the others A B B A like the targets, so a before/after of the schedule is one run.
    groups = [[dataclasses.replace(plan.workload, codec_chunk_schedule=s) for s in plan.schedules]]
    if args.audio_input_seconds:  # spoken input, next to the text workload (gRPC targets)
        spoken = dataclasses.replace(plan.workload, audio_input_seconds=args.audio_input_seconds)
        groups.append([dataclasses.replace(spoken, codec_chunk_schedule=s) for s in plan.schedules])
        for name in order:
            await clients[name].run([], spoken, True)  # warm the audio encoder path
    total = sum(
        len(order) * sum(map(len, groups)) * args.repeats * (args.num_prompts or max(3, c))
        for c in plan.concurrencies
        for _ in plan.modes
    )
    progress = tqdm(total=total, desc="bench", unit="req", file=sys.stderr, dynamic_ncols=True)
    for conc in plan.concurrencies:
        count = args.num_prompts or max(3, conc)
        for async_chunk in plan.modes:
            for group in groups:
                cells = interleave([(n, w) for n in order for w in group], args.repeats)
                for cell, (name, load) in enumerate(cells):
                    # Each cell its own prompts (same lengths): the thinker's prefix cache would
                    # serve a repeated prompt's prefill, and these requests share no prefix.
                    prompts = make_prompts(count, args.input_len, args.seed + conc + 7919 * cell)
                    label = name + load.label
                    progress.set_postfix_str(f"{label} c{conc} async={'on' if async_chunk else 'off'}")
                    results, duration = await run_cell(
                        clients[name],
                        prompts,
                        load,
                        async_chunk,
                        conc,
                        args.request_rate,
                        progress,
                        args.seed,
                    )
                    summary = summarize(results, duration, plan.threshold_s)
                    runs.setdefault((label, async_chunk, conc), []).append(summary)
    progress.close()
    rows = []
    for (name, async_chunk, conc), cell_runs in runs.items():
        rows.append({"target": name, "async": async_chunk, "concurrency": conc, **merge_runs(cell_runs)})
    rows.sort(key=lambda r: (r["target"], not r["async"], r["concurrency"]))
    return rows


@dataclass
class _Extras:
    """The optional measurements beside the table (None: not asked for)."""

    chunk_cost: dict[int, dict[str, float]] | None = None
    big_prompt: dict[str, Any] | None = None
    stage_timings: dict[str, dict[int, float | None]] | None = None
    long_prompt: dict[str, dict[str, Any]] | None = None


async def _extras(args: argparse.Namespace, started: _Started, make_prompts: PromptMaker) -> _Extras:
    """--chunk-cost, --big-prompt, --stage-timings and --long-prompt-tokens, in that order."""
    services, clients = started.services, started.clients
    extras = _Extras()
    if args.chunk_cost and services and "services" in clients:
        lengths = [int(x) for x in args.chunk_cost_prompts.split(",")]
        extras.chunk_cost = await chunk_cost(clients["services"], services, make_prompts, lengths, args.seed)
    if args.big_prompt and "gateway" in services:
        from omnistream.bench.big_prompt import big_prompt_effect

        sizes = [int(x) for x in args.big_prompt.split(",")]
        extras.big_prompt = await big_prompt_effect(
            f"http://127.0.0.1:{services['gateway'].http_port}", sizes
        )
    if args.stage_timings:
        from omnistream.bench.stages import stage_timings

        extras.stage_timings = await stage_timings(args.model)
    if args.long_prompt_tokens:
        from omnistream.bench.long_prompt import measure_in

        trees = {"this": Path(__file__).resolve().parents[2]}
        if args.long_prompt_baseline:
            trees["baseline"] = Path(args.long_prompt_baseline)
        extras.long_prompt = {}
        for label, tree in trees.items():  # each in a child process, that tree's code
            chunk = args.prefill_chunk if label == "this" else None
            extras.long_prompt[label] = await asyncio.to_thread(
                measure_in, tree, args.model, args.long_prompt_tokens, chunk
            )
    return extras


def _report(
    args: argparse.Namespace, out_dir: Path, t0: float, rows: list[dict[str, Any]], extras: _Extras
) -> int:
    """Write results.json, results.csv and the plots, print the table and the rest; the exit status."""
    from omnistream.bench.long_prompt import describe

    result_ratios = ratios(rows)
    payload = {
        "machine": machine_info(),
        "args": {k: (v if v != float("inf") else "inf") for k, v in vars(args).items() if k != "func"},
        "wall_seconds": time.perf_counter() - t0,
        "rows": rows,
        "ratios": result_ratios,
        "chunk_cost": extras.chunk_cost,
        "stage_timings": extras.stage_timings,
        "big_prompt": extras.big_prompt,
        "long_prompt": extras.long_prompt,
    }
    report.write_json(out_dir / "results.json", payload)
    report.write_csv(out_dir / "results.csv", rows)
    plots = [] if args.no_plots else report.plot(out_dir / "bench", rows)
    print(report.table(rows))
    print()
    for key, value in result_ratios.items():
        print(f"{key}: " + ("n/a" if value is None else f"{value:.3f}"))
    if extras.chunk_cost:
        for length, values in extras.chunk_cost.items():
            print(
                f"chunk cost, {length}-token prompt: thinker->talker "
                f"{values['thinker_to_talker_us']:.1f} us, "
                f"talker->code2wav {values['talker_to_code2wav_us']:.1f} us"
            )
    big_prompt = extras.big_prompt
    if big_prompt:
        print(
            f"huge prompts: small request median {big_prompt['small_alone_median_ms']:.0f} ms alone, "
            f"{big_prompt['small_with_big_prompts_median_ms']:.0f} ms beside them "
            f"(x{big_prompt['latency_ratio']:.2f}); /ready not 200 in {big_prompt['ready_not_200']} of "
            f"{big_prompt['ready_checks']} checks; {big_prompt['big_prompt_statuses']}"
        )
    for key, per_batch in (extras.stage_timings or {}).items():
        print(
            f"{key}: "
            + ", ".join(
                f"batch {b}: " + ("n/a" if ms is None else f"{ms:.2f}") for b, ms in per_batch.items()
            )
        )
    for label, measured in (extras.long_prompt or {}).items():
        print(describe(f"long prompt [{label}]", measured))
    names = ", ".join(["results.json", "results.csv", *(p.name for p in plots)])
    print(f"\nwrote {names} to {out_dir}")
    failed = sum(r["failed"] for r in rows)
    return 1 if failed else 0


async def run_bench(args: argparse.Namespace) -> int:
    if getattr(args, "conversation", False):
        from omnistream.bench.conversation import run_conversation

        return await run_conversation(args)
    if getattr(args, "voice_to_voice", False):
        from omnistream.bench.voice_to_voice import run_voice_to_voice

        return await run_voice_to_voice(args)
    import torch

    from omnistream.models.family import family_for, model_info

    torch.set_num_threads(1)  # as each stage service runs (see `omnistream serve --threads`)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    family = family_for(args.model)
    config, tokenizer = family.load_config(args.model), family.load_tokenizer(args.model)

    def make_prompts(count: int, length: int, seed: int) -> list[list[int]]:
        return family.random_prompts(config, tokenizer, count, length, seed)

    sample_rate = model_info(args.model).sample_rate
    plan = _plan(args)
    if plan is None:
        return 2
    started = _Started()
    t0 = time.perf_counter()
    try:
        _start_targets(args, plan, started, tokenizer, sample_rate)
        rows = await _measure(args, plan, started.clients, make_prompts)
        extras = await _extras(args, started, make_prompts)
        return _report(args, out_dir, t0, rows, extras)
    finally:
        await started.stop()
