"""`omnistream serve thinker|talker|code2wav`: one stage as its own process.

The checkpoint's family (picked from its config.json) builds and warms the engine; this module only
wires it to its servicer, which speaks the family-neutral stage protocol.
"""

from __future__ import annotations

import argparse
import sys

import torch

from omnistream.engine.load_options import LoadOptions
from omnistream.models.family import family_for
from omnistream.service.bootstrap import ServeOptions, run_stage_server
from omnistream.service.cpu_priority import lower_cpu_priority
from omnistream.service.metrics import StageMetrics
from omnistream.service.tracing import setup_tracing
from services import serve_args


async def serve(args: argparse.Namespace) -> int:
    refusal = serve_args.load_options_refusal(args)
    if refusal:
        print(f"omnistream serve {args.stage}: {refusal}", file=sys.stderr, flush=True)
        return 2
    for change in lower_cpu_priority(args.nice):  # before the engine and gRPC start theirs
        print(f"omnistream serve {args.stage}: {change}", file=sys.stderr, flush=True)
    if args.threads and getattr(args, "backend", None) != "vllm":
        torch.set_num_threads(args.threads)  # vLLM's worker process sets its own
    options = LoadOptions(args.device, args.dtype, args.allow_float64, **serve_args.stage_load_options(args))
    family = family_for(args.model)
    engine = family.engine(
        args.stage,
        args.model,
        options,
        max_batch=args.max_batch,
        max_requests=args.max_requests,
        max_model_len=args.max_model_len,
        prefill_chunk=args.prefill_chunk,
        **serve_args.schedule_options(args),
    )
    if args.stage == "thinker":
        from services.thinker.servicer import ThinkerServicer

        servicer_cls = ThinkerServicer
    elif args.stage == "talker":
        from services.talker.servicer import TalkerServicer

        servicer_cls = TalkerServicer
    else:
        from omnistream.service.heap_trim import HeapTrimmer
        from services.code2wav.servicer import Code2WavServicer

        engine.add_step_listener(HeapTrimmer())  # freed activations back to the OS: see heap_trim.py
        servicer_cls = Code2WavServicer
    servicer = servicer_cls(
        engine,
        StageMetrics(args.stage, engine),
        model_id=args.served_model_name,
        max_message_bytes=args.max_message_bytes,
    )
    serve_options = ServeOptions(
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        max_message_bytes=args.max_message_bytes,
        max_streams=engine.max_requests,
        grace_seconds=args.grace_seconds,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
    )

    async def warmup() -> None:
        await family.warm_up(args.stage, engine)
        servicer.speed.reset()  # the warm-up's first steps (compilation, allocation) are no measure
        await family.probe_speed(args.stage, engine)
        servicer.speed.seed()

    # Installed before the first stream can open; flushed (within its bound) once the server stopped.
    tracing = setup_tracing(args.stage, args.otlp_traces_endpoint)
    try:
        return await run_stage_server(servicer, warmup, serve_options)
    finally:
        if tracing is not None:
            tracing.shutdown()


def main(args: argparse.Namespace) -> int:
    import uvloop

    return uvloop.run(serve(args))
