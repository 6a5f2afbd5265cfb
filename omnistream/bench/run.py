"""`omnistream bench`: the seed's latency table for omnistream, services vs the in-process floor.

Method: warm-up requests are excluded; each (target, mode, concurrency) cell is measured in A B B A
order across the two targets so slow drift of the machine cancels; the spread between repeated
runs is reported beside the means; the commit and the machine are recorded with every result.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import re
import shlex
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from omnistream.bench import report
from omnistream.bench.cells import audio_holds, chunk_schedules, interleave, ratios
from omnistream.bench.clients import GrpcGatewayClient, InProcessClient, RestGatewayClient, Workload, run_cell
from omnistream.bench.machine import machine_info
from omnistream.bench.stats import merge_runs, summarize

# (count, input_len, seed) -> prompts of exactly input_len ids, in the model family's chat framing.
PromptMaker = Callable[[int, int, int], list[list[int]]]


def _scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values: dict[str, float] = {}
    for line in body.splitlines():
        m = re.match(
            r'^omnistream_stage_chunk_cpu_seconds_(sum|count)\{direction="(\w+)",stage="(\w+)"\} (\S+)', line
        )
        if m:
            values[f"{m.group(3)}.{m.group(2)}.{m.group(1)}"] = float(m.group(4))
    return values


async def chunk_cost(
    client, services: dict, make_prompts: PromptMaker, lengths: list[int], seed: int
) -> dict:
    """CPU per thinker->talker chunk (thinker out + talker in) and per talker->code2wav chunk (talker
    out + code2wav in), through the services, by prompt length."""
    ports = [s.metrics_port for name, s in services.items() if name != "gateway"]
    results = {}
    workload = Workload(output_len=100, audio_frames=60, ignore_eos=True, initial_codec_chunk_frames=4)
    for length in lengths:
        prompts = make_prompts(4, length, seed + length)
        await client.run(prompts[0], workload, True)  # warm the prompt length
        before = {}
        for port in ports:
            before.update(_scrape(port))
        for prompt in prompts[1:]:
            result = await client.run(prompt, workload, True)
            if not result.ok:
                raise RuntimeError(f"chunk-cost request failed: {result.error}")
        after = {}
        for port in ports:
            after.update(_scrape(port))

        def per_chunk(stage: str, direction: str, after=after, before=before) -> float:
            d_sum = after[f"{stage}.{direction}.sum"] - before.get(f"{stage}.{direction}.sum", 0.0)
            d_count = after[f"{stage}.{direction}.count"] - before.get(f"{stage}.{direction}.count", 0.0)
            if not d_count:
                raise RuntimeError(f"chunk cost: {stage} reported no {direction!r} chunk")
            return d_sum / d_count

        results[length] = {
            "thinker_to_talker_us": 1e6 * (per_chunk("thinker", "out") + per_chunk("talker", "in")),
            "talker_to_code2wav_us": 1e6 * (per_chunk("talker", "out") + per_chunk("code2wav", "in")),
        }
    return results


async def run_bench(args: argparse.Namespace) -> int:
    if getattr(args, "conversation", False):
        from omnistream.bench.conversation import run_conversation

        return await run_conversation(args)
    import torch
    from tqdm import tqdm

    from omnistream.engine.load_options import DEFAULT_MAX_BATCH, LoadOptions
    from omnistream.models.family import family_for, model_info
    from omnistream.pipeline import Pipeline

    torch.set_num_threads(1)  # as each stage service runs (see `omnistream serve --threads`)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    family = family_for(args.model)
    config, tokenizer = family.load_config(args.model), family.load_tokenizer(args.model)

    def make_prompts(count: int, length: int, seed: int) -> list[list[int]]:
        return family.random_prompts(config, tokenizer, count, length, seed)

    sample_rate = model_info(args.model).sample_rate
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if args.audio_input_seconds and args.transport == "rest" and "services" in targets:
        print(
            "omnistream bench: the spoken-input workload runs over gRPC (drop --transport rest)",
            file=sys.stderr,
        )
        return 2
    modes = [m.strip() == "async" for m in args.modes.split(",") if m.strip()]
    concurrencies = [int(c) for c in args.max_concurrency.split(",")]
    try:
        schedules = chunk_schedules(args.codec_chunk_schedules)
    except ValueError as exc:
        print(f"omnistream bench: {exc}", file=sys.stderr)
        return 2
    try:
        holds = audio_holds(args.audio_hold)
    except ValueError as exc:
        print(f"omnistream bench: {exc}", file=sys.stderr)
        return 2
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
    services: dict = {}
    clients: dict = {}
    pipeline = None
    pipelines: list = []
    t0 = time.perf_counter()
    try:
        if "services" in targets:
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
                    **prefill,
                    **nice,
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
                        RestGatewayClient(
                            f"http://127.0.0.1:{gateways[hold].http_port}", tokenizer, sample_rate
                        )
                        if args.transport == "rest"
                        else GrpcGatewayClient(gateways[hold].address)
                    )
        if "in-process" in targets:
            pipeline = Pipeline(args.model, LoadOptions(), max_batch=DEFAULT_MAX_BATCH, **prefill).start()
            clients["in-process"] = InProcessClient(pipeline)
        if "in-process-recompute" in targets:  # the previous Code2Wav decode, as a baseline
            baseline = Pipeline(
                args.model, LoadOptions(), max_batch=DEFAULT_MAX_BATCH, code2wav_decode="recompute", **prefill
            ).start()
            clients["in-process-recompute"] = InProcessClient(baseline)
            pipelines.append(baseline)
        order = [
            t for t in ("in-process", "in-process-recompute", "services", "services[no-hold]") if t in clients
        ]
        warm = make_prompts(max(args.warmup, 1), args.input_len, args.seed + 999)
        for name in order:
            for prompt in warm[: args.warmup]:
                await clients[name].run(prompt, workload, True)
        runs: dict[tuple[str, bool, int], list[dict]] = {}
        # One group per workload; within a group each schedule is a target of its own, interleaved
        # with the others A B B A like the targets, so a before/after of the schedule is one run.
        groups = [[dataclasses.replace(workload, codec_chunk_schedule=s) for s in schedules]]
        if args.audio_input_seconds:  # spoken input, next to the text workload (gRPC targets)
            spoken = dataclasses.replace(workload, audio_input_seconds=args.audio_input_seconds)
            groups.append([dataclasses.replace(spoken, codec_chunk_schedule=s) for s in schedules])
            for name in order:
                await clients[name].run([], spoken, True)  # warm the audio encoder path
        total = sum(
            len(order) * sum(map(len, groups)) * args.repeats * (args.num_prompts or max(3, c))
            for c in concurrencies
            for _ in modes
        )
        progress = tqdm(total=total, desc="bench", unit="req", file=sys.stderr, dynamic_ncols=True)
        for conc in concurrencies:
            count = args.num_prompts or max(3, conc)
            for async_chunk in modes:
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
                        summary = summarize(results, duration, threshold_s)
                        runs.setdefault((label, async_chunk, conc), []).append(summary)
        progress.close()
        rows = []
        for (name, async_chunk, conc), cell_runs in runs.items():
            rows.append({"target": name, "async": async_chunk, "concurrency": conc, **merge_runs(cell_runs)})
        rows.sort(key=lambda r: (r["target"], not r["async"], r["concurrency"]))
        cost = None
        if args.chunk_cost and services and "services" in clients:
            lengths = [int(x) for x in args.chunk_cost_prompts.split(",")]
            cost = await chunk_cost(clients["services"], services, make_prompts, lengths, args.seed)
        big_prompt = None
        if args.big_prompt and "gateway" in services:
            from omnistream.bench.big_prompt import big_prompt_effect

            sizes = [int(x) for x in args.big_prompt.split(",")]
            big_prompt = await big_prompt_effect(f"http://127.0.0.1:{services['gateway'].http_port}", sizes)
        timings = None
        if args.stage_timings:
            from omnistream.bench.stages import stage_timings

            timings = await stage_timings(args.model)
        long_prompt = None
        if args.long_prompt_tokens:
            from omnistream.bench.long_prompt import describe, measure_in

            trees = {"this": Path(__file__).resolve().parents[2]}
            if args.long_prompt_baseline:
                trees["baseline"] = Path(args.long_prompt_baseline)
            long_prompt = {}
            for label, tree in trees.items():  # each in a child process, that tree's code
                chunk = args.prefill_chunk if label == "this" else None
                long_prompt[label] = await asyncio.to_thread(
                    measure_in, tree, args.model, args.long_prompt_tokens, chunk
                )
        result_ratios = ratios(rows)
        payload = {
            "machine": machine_info(),
            "args": {k: (v if v != float("inf") else "inf") for k, v in vars(args).items() if k != "func"},
            "wall_seconds": time.perf_counter() - t0,
            "rows": rows,
            "ratios": result_ratios,
            "chunk_cost": cost,
            "stage_timings": timings,
            "big_prompt": big_prompt,
            "long_prompt": long_prompt,
        }
        report.write_json(out_dir / "results.json", payload)
        report.write_csv(out_dir / "results.csv", rows)
        plots = [] if args.no_plots else report.plot(out_dir / "bench", rows)
        print(report.table(rows))
        print()
        for key, value in result_ratios.items():
            print(f"{key}: " + ("n/a" if value is None else f"{value:.3f}"))
        if cost:
            for length, values in cost.items():
                print(
                    f"chunk cost, {length}-token prompt: thinker->talker "
                    f"{values['thinker_to_talker_us']:.1f} us, "
                    f"talker->code2wav {values['talker_to_code2wav_us']:.1f} us"
                )
        if big_prompt:
            print(
                f"huge prompts: small request median {big_prompt['small_alone_median_ms']:.0f} ms alone, "
                f"{big_prompt['small_with_big_prompts_median_ms']:.0f} ms beside them "
                f"(x{big_prompt['latency_ratio']:.2f}); /ready not 200 in {big_prompt['ready_not_200']} of "
                f"{big_prompt['ready_checks']} checks; {big_prompt['big_prompt_statuses']}"
            )
        for key, per_batch in (timings or {}).items():
            print(
                f"{key}: "
                + ", ".join(
                    f"batch {b}: " + ("n/a" if ms is None else f"{ms:.2f}") for b, ms in per_batch.items()
                )
            )
        for label, measured in (long_prompt or {}).items():
            print(describe(f"long prompt [{label}]", measured))
        names = ", ".join(["results.json", "results.csv", *(p.name for p in plots)])
        print(f"\nwrote {names} to {out_dir}")
        failed = sum(r["failed"] for r in rows)
        return 1 if failed else 0
    finally:
        for client in clients.values():
            if hasattr(client, "close"):
                await client.close()
        if pipeline is not None:
            pipeline.stop()
        for other in pipelines:
            other.stop()
        for service in reversed(list(services.values())):
            service.stop()
