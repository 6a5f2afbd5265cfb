"""`omnistream serve thinker|talker|code2wav`: one stage as its own process.

The parsed flags become two typed objects here, once: the service's `StageSettings` (ports, TLS,
threads: services/serve_args.py) and the engine's settings of this stage (omnistream/engine/settings.py).
The checkpoint's family (picked from its config.json) builds and warms the engine from the latter;
this module only wires it to its servicer, which speaks the family-neutral stage protocol.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, cast

import torch

from omnistream.engine.settings import STAGE_SETTINGS, EngineSettings, ThinkerEngineSettings
from omnistream.models.family import family_for
from omnistream.service.bootstrap import ServeOptions, run_stage_server
from omnistream.service.cpu_priority import lower_cpu_priority
from omnistream.service.metrics import StageMetrics
from omnistream.service.settings import build
from omnistream.service.tracing import setup_tracing
from services import serve_args
from services.serve_args import StageSettings

if TYPE_CHECKING:
    from omnistream.engine.api import (
        Code2WavStageEngine,
        StageEngine,
        TalkerStageEngine,
        ThinkerStageEngine,
    )
    from omnistream.service.stage_service import StageServicer


async def serve(args: argparse.Namespace) -> int:
    """The entry point: the namespace ends here."""
    stage: str = args.stage
    return await serve_stage(stage, build(StageSettings, args), build(STAGE_SETTINGS[stage], args))


async def serve_stage(stage: str, service: StageSettings, settings: EngineSettings) -> int:
    """Serve `stage`: `service` where and how (ports, TLS, threads), `settings` its engine's (the
    stage's class of omnistream/engine/settings.py), both as built from the flags once."""
    refusal = serve_args.load_options_refusal(settings)
    model = service.model  # (argparse requires --model or $OMNISTREAM_MODEL)
    if refusal or model is None:
        refusal = refusal or f"no checkpoint: pass --model or set ${serve_args.MODEL_ENV}"
        print(f"omnistream serve {stage}: {refusal}", file=sys.stderr, flush=True)
        return 2
    for change in lower_cpu_priority(service.nice):  # before the engine and gRPC start theirs
        print(f"omnistream serve {stage}: {change}", file=sys.stderr, flush=True)
    vllm = isinstance(settings, ThinkerEngineSettings) and settings.backend == "vllm"
    if service.threads and not vllm:
        torch.set_num_threads(service.threads)  # vLLM's worker process sets its own
    family = family_for(model)
    engine = family.engine(stage, model, settings)
    servicer = _servicer(stage, engine, service)
    serve_options = ServeOptions(
        host=service.host,
        port=service.port,
        metrics_port=service.metrics_port,
        metrics_host=service.metrics_host,
        max_message_bytes=service.max_message_bytes,
        max_streams=engine.max_requests,
        grace_seconds=service.grace_seconds,
        tls_cert=service.tls_cert,
        tls_key=service.tls_key,
        tls_client_ca=service.tls_client_ca,
    )

    async def warmup() -> None:
        await family.warm_up(stage, engine)
        servicer.speed.reset()  # the warm-up's first steps (compilation, allocation) are no measure
        await family.probe_speed(stage, engine)
        servicer.speed.seed()

    # Installed before the first stream can open; flushed (within its bound) once the server stopped.
    tracing = setup_tracing(stage, service.otlp_traces_endpoint)
    try:
        return await run_stage_server(servicer, warmup, serve_options)
    finally:
        if tracing is not None:
            tracing.shutdown()


def _servicer(stage: str, engine: StageEngine, service: StageSettings) -> StageServicer:
    """The stage's servicer over its engine (the family built the stage's engine: `cast` names the
    stage's protocol, omnistream/models/qwen3_omni/engine_types.py holds each engine to it)."""
    metrics = StageMetrics(stage, engine)
    identity: dict[str, Any] = {
        "model_id": service.served_model_name,
        "max_message_bytes": service.max_message_bytes,
    }
    if stage == "thinker":
        from services.thinker.servicer import ThinkerServicer

        return ThinkerServicer(cast("ThinkerStageEngine", engine), metrics, **identity)
    if stage == "talker":
        from services.talker.servicer import TalkerServicer

        return TalkerServicer(cast("TalkerStageEngine", engine), metrics, **identity)
    from omnistream.service.heap_trim import HeapTrimmer
    from services.code2wav.servicer import Code2WavServicer

    engine.add_step_listener(HeapTrimmer())  # freed activations back to the OS: see heap_trim.py
    return Code2WavServicer(cast("Code2WavStageEngine", engine), metrics, **identity)


def main(args: argparse.Namespace) -> int:
    import uvloop

    return uvloop.run(serve(args))
