"""`omnistream serve thinker|talker|code2wav`: one stage as its own process."""

from __future__ import annotations

import argparse

import torch

from omnistream.checkpoint import LoadOptions
from omnistream.metrics import StageMetrics
from omnistream.qwen3_omni.codec_chunks import ChunkPlan
from omnistream.stage_service import ServeOptions, run_stage_server


async def _warm_thinker(engine) -> None:
    from services.thinker.engine import ThinkerParams

    out = engine.add_request("warmup", [0, 1, 2], ThinkerParams(max_tokens=2, ignore_eos=True))
    async for _ in out:
        pass


async def _warm_talker(engine) -> None:
    from services.talker.engine import TalkerParams

    cfg = engine.config
    prompt = [
        cfg.im_start_token_id,
        cfg.user_token_id,
        0,
        cfg.im_end_token_id,
        0,
        cfg.im_start_token_id,
        cfg.assistant_token_id,
        0,
    ]
    out = engine.add_request("warmup", TalkerParams(max_frames=2))
    engine.feed("warmup", [0], True, prompt_ids=prompt)
    async for _ in out:
        pass


async def _warm_code2wav(engine) -> None:
    out = engine.add_request("warmup", ChunkPlan(2, 25, 25))
    engine.feed("warmup", torch.zeros((engine.num_quantizers, 3), dtype=torch.long), True)
    async for _ in out:
        pass


async def serve(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    options = LoadOptions(args.device, args.dtype)
    common = {"max_batch": args.max_batch, "max_requests": args.max_requests}
    if args.stage == "thinker":
        from services.thinker.engine import ThinkerEngine
        from services.thinker.servicer import ThinkerServicer

        engine = ThinkerEngine(args.model, options, max_model_len=args.max_model_len, **common)
        servicer_cls, warm = ThinkerServicer, _warm_thinker
    elif args.stage == "talker":
        from services.talker.engine import TalkerEngine
        from services.talker.servicer import TalkerServicer

        engine = TalkerEngine(args.model, options, max_model_len=args.max_model_len * 2, **common)
        servicer_cls, warm = TalkerServicer, _warm_talker
    else:
        from omnistream.heap_trim import HeapTrimmer
        from services.code2wav.engine import Code2WavEngine
        from services.code2wav.servicer import Code2WavServicer

        engine = Code2WavEngine(args.model, options, **common)
        engine.add_step_listener(HeapTrimmer())  # freed activations back to the OS: see heap_trim.py
        servicer_cls, warm = Code2WavServicer, _warm_code2wav
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
        await warm(engine)

    return await run_stage_server(servicer, warmup, serve_options)


def main(args: argparse.Namespace) -> int:
    import uvloop

    return uvloop.run(serve(args))
